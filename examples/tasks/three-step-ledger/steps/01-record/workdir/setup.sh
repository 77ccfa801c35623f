#!/usr/bin/env bash
# Runs before the agent, as the agent's user, from the working directory.
mkdir -p /app/ledger
: > /app/ledger/entries.csv
