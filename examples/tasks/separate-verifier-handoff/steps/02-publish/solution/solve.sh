#!/usr/bin/env bash
mkdir -p /app/publish
{ cat /app/draft.txt; echo final; } > /app/publish/final.txt
echo "remember: publish" > /tmp/notes.txt
