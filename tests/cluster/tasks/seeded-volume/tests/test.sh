#!/bin/bash
# 1 when the reader sees, in the volume only sidecars name, the seeder's image content as Docker
# copies it into a new volume: the operator image's /var/lib/episode-operator and its data/, uid 65532's.
seen=$(python3 - <<'PY'
import time
import urllib.request

error = None
for _ in range(40):  # the reader may still be starting
    try:
        print(urllib.request.urlopen("http://reader:8080/", timeout=2).read().decode().strip())
        break
    except Exception as failure:
        error = failure
        time.sleep(0.25)
else:
    print(f"unreachable: {error}")
PY
)
echo "the reader sees:"
echo "$seen"
if grep -qx "/seen 65532:65532 755" <<<"$seen" && grep -qx "data 65532:65532 755" <<<"$seen"; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
