"""Prometheus metrics: what someone running thousands of episodes watches.

Outcomes and failure kinds are kept apart as everywhere else (an outage is never a
reward), phase durations show where an episode's time goes (pod start, setup, agent,
collect, verify), and exec transport errors show a struggling API server before it
becomes outages.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 28800)
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    """The operator's metrics in their own registry (tests create as many as they like), with the
    process's own (``process_*``: CPU, memory, open files) and the interpreter's (``python_*``), as
    Prometheus's default registry has them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.episodes = Counter(
            "episode_operator_episodes",
            "Episodes finished, by outcome and failure kind.",
            ["outcome", "failure_kind"],
            registry=self.registry,
        )
        self.turns = Counter(
            "episode_operator_turns",
            "Turns finished: graded, measured_zero (no valid reward), failed (preparation).",
            ["result", "failure_kind"],
            registry=self.registry,
        )
        self.outages = Counter(
            "episode_operator_outages",
            "Attempts lost to an outage, by kind; never scored.",
            ["kind"],
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "episode_operator_phase_duration_seconds",
            "Time spent per phase of a turn or episode.",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self.rewards = Histogram(
            "episode_operator_episode_reward",
            "Rewards of graded episodes.",
            buckets=REWARD_BUCKETS,
            registry=self.registry,
        )
        self.exec_errors = Counter(
            "episode_operator_exec_errors",
            "Exec transport failures (each retried), by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "episode_operator_api_requests",
            "Requests sent to the Kubernetes API by the operator's own client, by verb and resource as the "
            "API server's apiserver_request_total names them (kopf's watches and finalizer patches are not counted).",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.api_errors = Counter(
            "episode_operator_api_errors",
            "Requests of the operator's own client that got no answer (connection refused or reset, timed out), "
            "by verb and resource: what an API server outage looks like from here.",
            ["verb", "resource"],
            registry=self.registry,
        )
        self.sandbox_calls = Counter(
            "episode_operator_sandbox_calls",
            "Supervisor calls into sandbox pods, by how they went: on the container's open session, or by an "
            "exec of their own (placement, one while the session is busy, one after the session failed).",
            ["transport"],
            registry=self.registry,
        )
        self.events = Counter(
            "episode_operator_events",
            "Kubernetes Events recorded, by what became of them: posted; combined into one of the same object "
            "and reason still waiting (the operator's Event rate limit was reached); duplicate (the Event of that "
            "occasion was posted already, by another replica or before a restart); failed; dropped (the backlog "
            "waiting for the rate limit was full).",
            ["result"],
            registry=self.registry,
        )
        self.events_waiting = Gauge(
            "episode_operator_events_waiting",
            "Kubernetes Events recorded and waiting for the operator's Event rate limit (at most 1,000).",
            registry=self.registry,
        )
        self.warm_pool_pods = Gauge(
            "episode_operator_warm_pool_pods",
            "Unclaimed pods of each EpisodeSet's warm pool, by state: ready (marked fresh, claimable) or starting.",
            ["namespace", "set", "state"],
            registry=self.registry,
        )
        self.warm_pool_claims = Counter(
            "episode_operator_warm_pool_claims",
            "Attempts' claims of warm pool pods, by result: claimed; lost_race (another claimer won the pod); "
            "stale (something ran in it since it was marked: deleted); none (no claimable pod: a fresh pod is made).",
            ["result"],
            registry=self.registry,
        )
        self.active = Gauge("episode_operator_active_episodes", "Episodes being driven now.", registry=self.registry)
        self.pending = Gauge(
            "episode_operator_pending_episodes",
            "Episodes waiting for a free slot (maxActiveEpisodes).",
            registry=self.registry,
        )

    # The runtime's EpisodeObserver ------------------------------------------------------
    def phase_finished(self, phase: str, seconds: float) -> None:
        self.phase_seconds.labels(phase).observe(seconds)

    def turn_finished(self, result: str, failure_kind: str | None) -> None:
        self.turns.labels(result, failure_kind or "").inc()

    def outage(self, kind: str) -> None:
        self.outages.labels(kind).inc()

    def episode_finished(self, outcome: str, failure_kind: str | None, reward: float | None) -> None:
        self.episodes.labels(outcome, failure_kind or "").inc()
        if outcome == "Graded" and reward is not None:
            self.rewards.observe(reward)
