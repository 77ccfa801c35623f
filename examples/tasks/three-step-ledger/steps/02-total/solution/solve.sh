#!/usr/bin/env bash
awk -F, '{s += $2} END {print s}' /app/ledger/entries.csv > /app/total.txt
