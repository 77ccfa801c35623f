"""One turn of an episode, as a declared state machine: start with ``table.py``.

``table.py`` is the machine (stage → step, next stage, publication, network, restart);
``prepare.py``, ``agent.py``, ``collect.py`` and ``verify.py`` are the steps; ``turn_failures.py``
says what a failed sandbox call means; ``context.py`` is what a step sees.
"""
