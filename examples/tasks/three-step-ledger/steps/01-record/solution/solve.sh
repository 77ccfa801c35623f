#!/usr/bin/env bash
awk '{print $1 "," $2}' /app/incoming.txt >> /app/ledger/entries.csv
