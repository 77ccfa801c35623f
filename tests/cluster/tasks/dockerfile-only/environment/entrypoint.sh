#!/bin/sh
# What a task image's entrypoint does: export what the tests read, start the task's service, then
# run what the container was given.
printf 'GREETING=%s\n' "$GREETING" > /tmp/environment.txt
python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv/site > /tmp/http.log 2>&1 &
exec "$@"
