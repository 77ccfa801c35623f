#!/bin/bash
echo hello > hello.txt
