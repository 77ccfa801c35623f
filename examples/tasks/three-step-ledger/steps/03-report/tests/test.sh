#!/usr/bin/env bash
source /tests/helpers.sh
[ "$(cat /app/report.txt 2>/dev/null)" = "rows=3 total=42" ] && write_reward 1 || write_reward 0
