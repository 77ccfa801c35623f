#!/bin/bash
# 1 when this verifier's own keeper answers and holds nothing of the agent's turn.
answer=$(python3 - <<'PY'
import time
import urllib.request

error = None
# The services are reached by name through the pod's /etc/hosts; without a keeper there, a DNS lookup
# would only wait out its timeouts.
hosts = open("/etc/hosts").read().split()
for _ in range(40 if "keeper" in hosts else 0):  # the keeper may still be starting
    try:
        print(urllib.request.urlopen("http://keeper:8080/", timeout=2).read().decode().strip())
        break
    except Exception as failure:
        error = failure
        time.sleep(0.25)
else:
    print(f"unreachable: {error or 'no keeper in /etc/hosts'}")
PY
)
echo "the agent's keeper said: $(cat /logs/artifacts/agent-saw.txt 2>&1)"
echo "this verifier's keeper said: $answer"
echo "this verifier's /state: $(ls -A /state 2>&1 | xargs)"
case "$answer" in "boot "*"; /state: empty") echo 1 ;; *) echo 0 ;; esac > /logs/verifier/reward.txt
