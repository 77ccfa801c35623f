"""The operator starts kopf only once the API server serves Episodes and EpisodeSets (handlers.wait_until_served):
kopf reads discovery once as it starts, and a CRD created a moment ago can be Established and not yet listed."""

from __future__ import annotations

import asyncio
import logging

import pytest

from episode_operator import handlers
from episode_operator.api.episode_resource import PLURAL
from episode_operator.api.episodeset_resource import SET_PLURAL
from episode_operator.api.vocabulary import GROUP, VERSION


class Discovery:
    """The API server's discovery of one group version, as it lists resources over successive reads."""

    def __init__(self, *answers: set[str]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str]] = []

    async def served_resources(self, group: str, version: str) -> set[str]:
        self.asked.append((group, version))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_startup_waits_until_both_resources_are_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "SERVED_POLL_SEC", 0)
    discovery = Discovery(set(), {PLURAL}, {PLURAL, SET_PLURAL, "episodes/status"})
    asyncio.run(handlers.wait_until_served(discovery, logging.getLogger("test")))  # type: ignore[arg-type]
    assert discovery.asked == [(GROUP, VERSION)] * 3


def test_without_the_crds_startup_goes_on_after_its_bound_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(handlers, "SERVED_POLL_SEC", 0)
    monkeypatch.setattr(handlers, "SERVED_WAIT_SEC", 0.05)
    discovery = Discovery(set())
    with caplog.at_level(logging.WARNING):
        asyncio.run(handlers.wait_until_served(discovery, logging.getLogger("test")))  # type: ignore[arg-type]
    assert f"does not serve episodes, episodesets of {GROUP}/{VERSION}" in caplog.text
    assert "install-crd" in caplog.text
