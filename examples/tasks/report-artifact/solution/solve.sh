#!/usr/bin/env bash
mkdir -p /app/out
echo "total: $((2 + 3 + 4))" > /app/out/report.txt
