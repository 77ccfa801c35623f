#!/usr/bin/env bash
echo 'Hello, world!' > /app/hello.txt
