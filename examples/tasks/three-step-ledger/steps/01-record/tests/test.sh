#!/usr/bin/env bash
source /tests/helpers.sh
expected=$'apples,10\npears,12\nplums,20'
if [ "$(cat "${LEDGER}" 2>/dev/null)" = "${expected}" ]; then write_reward 1; else write_reward 0; fi
