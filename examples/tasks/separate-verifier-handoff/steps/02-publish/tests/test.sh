#!/usr/bin/env bash
# Runs in a fresh verifier pod: the published folder is here, the agent's /tmp is not.
published=0
[ "$(cat /app/publish/final.txt 2>/dev/null)" = $'draft\nfinal' ] && published=1
isolated=1
[ -e /tmp/notes.txt ] && isolated=0
printf '{"reward": %s, "published": %s, "isolated": %s}\n' "$published" "$published" "$isolated" \
  > /logs/verifier/reward.json
