#!/usr/bin/env bash
[ "$(cat /app/answer.txt 2>/dev/null)" = "${EXPECTED}" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
