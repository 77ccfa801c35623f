"""How long the operator waits, and how often: the one home of the defaults that the operator's
command line (cli/operator_main.py), the Helm chart's values, the handlers, the driver, the kube
provider and the runner share. Each layer takes a :class:`Timing` whole; none repeats a number."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    # An image that has failed to pull for this long makes the attempt an outage (--pull-grace).
    pull_grace_sec: float = 120.0
    # The longest single wait for a job: a bounded long poll of the supervisor (--poll-interval).
    poll_interval_sec: float = 30.0
    # A pod the scheduler cannot place is waited for this long (other Episodes free capacity),
    # then the attempt is an outage (--unschedulable-timeout).
    unschedulable_timeout_sec: float = 3600.0
    # A missing task ConfigMap is waited for this long: GitOps applies objects in any order.
    source_wait_sec: float = 30.0
    # Attempt n+1 after an outage starts backoff_base_sec * 2**(n-1) later, at most backoff_max_sec.
    backoff_base_sec: float = 5.0
    backoff_max_sec: float = 120.0

    def backoff_sec(self, attempt: int) -> float:
        """How long after attempt ``attempt`` ended in an outage the next one starts."""
        return min(self.backoff_base_sec * 2.0 ** (attempt - 1), self.backoff_max_sec)


DEFAULT_TIMING = Timing()

# A job past its timeout is sent TERM, then KILL this much later (the supervisor's --kill-after):
# the runner's first wait for a job allows for it.
KILL_AFTER_SEC = 5.0
