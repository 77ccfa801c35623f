echo 1 > /app/reward-wanted.txt
