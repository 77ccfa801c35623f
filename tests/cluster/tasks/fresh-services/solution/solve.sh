#!/bin/bash
# The agent's turn: plant a file in the volume main shares with the keeper, and keep what the keeper
# then says (it may still be starting: ask until it answers, bounded by the agent's timeout).
echo "the agent was here" > /state/planted.txt
until answer=$(python3 -c "import urllib.request as u; print(u.urlopen('http://keeper:8080/', timeout=2).read().decode().strip())" 2>/dev/null); do
  sleep 0.25
done
echo "$answer" > /logs/artifacts/agent-saw.txt
