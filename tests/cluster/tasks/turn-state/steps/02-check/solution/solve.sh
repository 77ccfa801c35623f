{
  echo "user=$(id -un)"
  echo "tests=$(ls -A /tests 2>/dev/null | tr '\n' ' ')"
  echo "verifier=$(ls -A /logs/verifier 2>/dev/null | tr '\n' ' ')"
  if [ -d "/proc/$(cat /app/sleeper.pid)" ]; then echo "sleeper=alive"; else echo "sleeper=gone"; fi
  echo "workdir_owner=$(stat -c %U /app)"
} > /app/observations.txt
