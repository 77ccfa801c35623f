echo from-agent > /app/shared.txt
echo keep > /app/keep.txt
sleep 3000 > /dev/null 2>&1 &
echo $! > /app/sleeper.pid
