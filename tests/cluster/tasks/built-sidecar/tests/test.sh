#!/bin/bash
grep -q 42 /tmp/answer.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
