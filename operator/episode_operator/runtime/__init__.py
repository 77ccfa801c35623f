"""The episode runner: Gym's semantics of a task folder's turns, against a sandbox protocol.

Start with ``turn/table.py``: the turn as one declared state machine — each stage's step,
its successor, whether it is written to the status before it runs, its network and what a
restarted operator does there. ``episode.py`` walks that table turn after turn and owns
attempts, outages, the roll-up and the ending; ``agents/`` is the registry of agent kinds;
``admission.py`` decides, without I/O, whether an Episode can run. ``sandbox_protocol.py`` is the
protocol a sandbox offers (a pod in production, ``supervisor.py``/``supervisor.sh`` inside it).
"""
