#!/bin/sh
# main's ENTRYPOINT: leave evidence of its start in the volume it shares with the reader (a token
# only this start knows, kept in /tmp for the verifier too), then run what the container was given.
set -e
token=$(cat /proc/sys/kernel/random/uuid)
echo "$token" > /tmp/startup-token
echo "$token" > /startup/evidence.txt
exec "$@"
