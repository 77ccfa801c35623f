# Runs as nobody. A listing that fails says so (never an empty answer that reads as "cleared").
listing() { if found=$(ls -A "$1" 2>&1); then echo $found; else echo "unreadable: $found"; fi; }
{
  echo "user=$(id -un)"
  echo "tests=$(listing /tests)"
  echo "verifier=$(listing /logs/verifier)"
  if [ -d "/proc/$(cat /app/sleeper.pid)" ]; then echo "sleeper=alive"; else echo "sleeper=gone"; fi
  echo "workdir_owner=$(stat -c %U /app)"
} > /app/observations.txt
