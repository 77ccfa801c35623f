"""Model-call capture: a recording proxy between the agent and its model, and what is built from its records.

The proxy (:mod:`.proxy`, the only module here doing network I/O) runs as its own container in the
agent's pod, holds the real API key and writes every exchange to a store no other container mounts
(:mod:`.store`). Everything else is pure: the record models and their derivations (:mod:`.records`,
mirroring NeMo Gym's ``ng_model_call_capture``), SSE reassembly (:mod:`.sse`), the wire rules of the
three dialects (:mod:`.wire`), conversations (:mod:`.conversation`), ATIF trajectories (:mod:`.atif`)
and Gym's observation records (:mod:`.observability`).
"""
