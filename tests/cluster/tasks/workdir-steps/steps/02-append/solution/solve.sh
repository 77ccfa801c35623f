#!/bin/bash
echo again >> hello.txt
