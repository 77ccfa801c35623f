#!/bin/bash
grep -q "hello from replay" /tmp/answer.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
