"""The issue-7 benchmark suite: what the operator costs per turn, per episode and at scale.

Every group measures the operator (run as its own process through the cluster-test harness)
and, in the same run, a baseline that does the same minimal work directly with the Python
``kubernetes`` client. Entry point: ``bench/run.py``.
"""
