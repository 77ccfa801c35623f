"""Model-call capture: a recording proxy between the agent and its model, and what is built from its records.

The proxy (:mod:`.proxy`, the only module here doing network I/O) runs as its own container in the
agent's pod, from the operator's image, and holds the real API key:

    args:  capture-proxy --listen 127.0.0.1:PORT --upstream MODEL_BASE_URL [--upstream-address IP]...
           --store /capture --max-record-bytes N --max-journal-bytes N
           [--token-ids] [--connect-timeout S] [--read-timeout S] [--max-call-seconds S] [--fsync]
    env:   EPISODE_CAPTURE_API_KEY from the Secret (secretKeyRef); nowhere else
    volume: an emptyDir at /capture, mounted in this container only

The agent gets ``agent_base_url("127.0.0.1", PORT, MODEL_BASE_URL)`` and a placeholder key. The proxy
connects only to the addresses the operator resolved the upstream's host to (``--upstream-address``;
the pod's ``/etc/hosts`` is the agent's to rewrite) and forwards only the model APIs' routes
(:data:`.wire.ROUTES`). The
operator names the current turn and reads a turn's records by exec into the capture container
(``capture-turn``, ``capture-harvest``; :mod:`.store` says why not a port). Everything else is pure:
the record models and their derivations (:mod:`.records`, mirroring NeMo Gym's
``ng_model_call_capture``), SSE reassembly (:mod:`.sse`), the wire rules of the three dialects
(:mod:`.wire`), conversations (:mod:`.conversation`), the token ids an answer's continuation carries
back (:mod:`.correction`), ATIF trajectories (:mod:`.atif`) and Gym's observation records
(:mod:`.observability`).
"""
