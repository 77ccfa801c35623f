"""What every group gets: the cluster, this run's namespaces and output folder, and the options."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from .cluster import Namespaces, Operator, apiserver_started, other_operators, wait_no_pods


@dataclass
class Context:
    api: client.ApiClient
    kubeconfig: Path
    namespaces: Namespaces
    out: Path
    quick: bool
    profile: bool
    results: dict[str, Any] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    disturbances: list[str] = field(default_factory=list)
    loads: dict[str, tuple[float, float]] = field(default_factory=dict)
    quiet_load: float = 0.0
    quiet_wait_sec: float = 0.0

    @property
    def operator_glob(self) -> str:
        return f"{self.namespaces.prefix}*"

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def show(self, text: str) -> None:
        """Print a table as soon as it is measured (and keep it for RESULTS-style output)."""
        self.tables.append(text)
        print(text, flush=True)

    @contextlib.contextmanager
    def group(
        self, label: str, *, program: tuple[str, ...] | None = None, env: dict[str, str] | None = None
    ) -> Iterator[tuple[str, Operator]]:
        """A fresh namespace and a fresh operator process for one group; both gone afterwards.

        A fresh process per group keeps CPU seconds and peak RSS attributable to that group.
        The namespace is deleted while the operator still runs, so it can release its
        finalizers; one that stays stuck is freed by hand. ``program`` and ``env`` change how
        the operator process is started (:class:`tests.cluster.harness.OperatorProcess`).
        """
        self.wait_for_quiet(label)
        load_before = os.getloadavg()[0]
        apiserver = apiserver_started(self.api)
        others = other_operators()
        namespace = self.namespaces.create(label)
        operator = Operator(self.kubeconfig, self.out, self.operator_glob, label, program=program, env=env)
        with operator:
            self.say(f"{label}: operator pid {operator.pid} healthy after {operator.healthy_after_sec:.1f} s")
            try:
                yield namespace, operator
                self.loads[label] = (load_before, os.getloadavg()[0])
                if apiserver_started(self.api) != apiserver:
                    self.disturbances.append(f"{label}: the API server restarted during the group")
                for other in sorted(set(other_operators(own=[operator.pid])) | set(others)):
                    self.disturbances.append(f"{label}: another operator shared the CPUs: {other}")
            finally:
                self.say(f"{label}: deleting namespace {namespace}")
                if not self.namespaces.delete(namespace, timeout=240):
                    stripped = self.namespaces.strip_finalizers(namespace)
                    self.say(f"{label}: namespace stuck; removed {stripped} finalizer(s)")
                    self.namespaces.delete(namespace, timeout=120)

    def wait_for_quiet(self, label: str) -> None:
        """Wait (up to ``quiet_wait_sec``) until the 1-minute load average is below ``quiet_load``."""
        if not self.quiet_load:
            return
        deadline = time.monotonic() + self.quiet_wait_sec
        while os.getloadavg()[0] > self.quiet_load and time.monotonic() < deadline:
            self.say(f"{label}: waiting for a quieter machine (load {os.getloadavg()[0]:.1f} > {self.quiet_load})")
            time.sleep(15)

    def settle(self, namespace: str) -> None:
        """Let the previous run's pods go away so they do not load the next measurement."""
        wait_no_pods(self.api, namespace)
