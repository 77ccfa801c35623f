#!/usr/bin/env bash
# Fallback oracle (used by 03-report, which has no solution/ of its own).
set -e
total=$(awk -F, '{s += $2} END {print s}' /app/ledger/entries.csv)
echo "rows=$(grep -c . /app/ledger/entries.csv) total=${total}" > /app/report.txt
mkdir -p /logs/artifacts && cp /app/report.txt /logs/artifacts/report-copy.txt
