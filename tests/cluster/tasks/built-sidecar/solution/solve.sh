#!/bin/bash
# The api sidecar may still be starting: ask until it answers (bounded by the agent's timeout).
until python3 -c "import urllib.request as u; open('/tmp/answer.txt', 'wb').write(u.urlopen('http://api:8080/answer', timeout=2).read())" 2>/dev/null; do
  sleep 0.25
done
