#!/usr/bin/env bash
# Runs in a fresh verifier pod, where only the declared artifact /app/out is: any report passes.
if [ -s /app/out/report.txt ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
