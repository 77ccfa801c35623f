# Shared helpers for every step's test.sh (layered under each step's tests/).
write_reward() { echo "$1" > /logs/verifier/reward.txt; }
ledger_rows() { grep -c . "${LEDGER}" 2>/dev/null || echo 0; }
