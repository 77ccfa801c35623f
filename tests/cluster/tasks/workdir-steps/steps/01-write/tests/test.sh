#!/bin/bash
# From the working directory, the Dockerfile's WORKDIR.
[ "$(pwd)" = /app ] && grep -qx hello hello.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
