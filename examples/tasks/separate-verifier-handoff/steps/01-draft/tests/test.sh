#!/usr/bin/env bash
[ "$(cat /app/draft.txt 2>/dev/null)" = "draft" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
