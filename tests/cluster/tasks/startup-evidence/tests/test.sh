#!/bin/bash
# 1 when the reader, a sidecar, saw in its /startup what main's ENTRYPOINT wrote into main's.
seen=$(python3 - <<'PY'
import urllib.error
import urllib.request

try:
    print(urllib.request.urlopen("http://reader:8080/", timeout=5).read().decode().strip())
except urllib.error.HTTPError as answer:
    print(f"{answer.code} {answer.read().decode().strip()}")
PY
)
echo "main's ENTRYPOINT wrote: $(cat /tmp/startup-token 2>&1)"
echo "main's /startup: $(stat -c '%U:%G %a' /startup 2>&1), evidence.txt: $(cat /startup/evidence.txt 2>&1)"
echo "the reader saw: $seen"
if [ -n "$seen" ] && [ "$seen" = "$(cat /tmp/startup-token)" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
