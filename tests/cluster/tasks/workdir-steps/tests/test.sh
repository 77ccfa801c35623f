#!/bin/bash
# Step 02's verifier: a fresh pod, its image replayed from the same Dockerfile, the artifact at /app/hello.txt.
[ "$(pwd)" = /app ] && [ "$(cat hello.txt)" = "$(printf 'hello\nagain')" ] \
  && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
