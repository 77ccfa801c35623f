obs() { grep "^$1=" /app/observations.txt | cut -d= -f2-; }
score() { if [ "$1" = "$2" ]; then echo 1; else echo 0; fi; }
workdir_replaced=$(score "$(cat /app/shared.txt)" "from-workdir")
kept=$(score "$(cat /app/keep.txt)" "keep")
process_alive=$(score "$(obs sleeper)" "alive")
user_switched=$(score "$(obs user)" "nobody")
owner_switched=$(score "$(obs workdir_owner)" "nobody")
tests_cleared=$(score "$(obs tests)" "")
verifier_cleared=$(score "$(obs verifier)" "")
all=$((workdir_replaced * kept * process_alive * user_switched * owner_switched * tests_cleared * verifier_cleared))
cat > /logs/verifier/reward.json <<JSON
{"reward": $all, "workdir_replaced": $workdir_replaced, "kept": $kept, "process_alive": $process_alive,
 "user_switched": $user_switched, "owner_switched": $owner_switched, "tests_cleared": $tests_cleared,
 "verifier_cleared": $verifier_cleared}
JSON
