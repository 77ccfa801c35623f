#!/bin/bash
# Runs from the working directory: the Dockerfile's WORKDIR.
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ "$(pwd)" = /app ] || fail "test.sh runs in $(pwd), not the WORKDIR /app"
[ "$(cat whoami.txt)" = "agent /app" ] || fail "the agent ran as: $(cat whoami.txt)"
grep -q "site index" answer.txt || fail "answer.txt: $(cat answer.txt)"
[ "$(stat -c %U answer.txt)" = agent ] || fail "answer.txt belongs to $(stat -c %U answer.txt)"
[ "$(cat data.txt)" = "copied by COPY" ] || fail "data.txt: $(cat data.txt)"
grep -qx "GREETING=hello from task.toml" /tmp/environment.txt || fail "the entrypoint saw: $(cat /tmp/environment.txt)"
echo 1 > /logs/verifier/reward.txt
