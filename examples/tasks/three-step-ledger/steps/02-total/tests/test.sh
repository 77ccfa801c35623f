#!/usr/bin/env bash
source /tests/helpers.sh
total_ok=0
[ "$(cat /app/total.txt 2>/dev/null | tr -d '[:space:]')" = "${EXPECTED_TOTAL}" ] && total_ok=1
rows_ok=0
[ "$(ledger_rows)" = "3" ] && rows_ok=1
reward=$(python3 -c "print(($total_ok + $rows_ok) / 2)")
printf '{"reward": %s, "total_ok": %s, "rows_ok": %s}\n' "$reward" "$total_ok" "$rows_ok" > /logs/verifier/reward.json
