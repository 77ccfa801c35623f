"""Driving a regrade (``spec.regrade``): the original read once, its kept artifacts checked, then the runner.

The driver (kube/driver.py) has read the regrade's task (the tests it verifies with) and admitted it.
On the first pass, before any pod, this reads the original Episode, decides what is verified again
(runtime/regrade.py :func:`plan_regrade`) and checks that the operator's store kept each of those turns'
artifacts; any refusal ends the regrade ``TerminalFailure`` (``episode:regrade_refused``) naming why. The
decision is written into ``status.regrade`` with the first status, so a restarted operator resumes from it
alone, even once the original is gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from episode_operator.api.episode_resource import EpisodeStatus, RegradeSpec, RegradeStatus, TurnStatus
from episode_operator.api.vocabulary import FAILURE_REGRADE_REFUSED
from episode_operator.kube.client import KubeClient, NotFound
from episode_operator.kube.objects.pods import OwnerRef
from episode_operator.kube.replicas import Claim
from episode_operator.kube.running import episode_provider, runner_config
from episode_operator.kube.status import KubeStatusSink, refuse
from episode_operator.runtime.admission import Admission, Refusal
from episode_operator.runtime.episode import EpisodeObserver
from episode_operator.runtime.episode_store import ARTIFACTS, MANIFEST, EpisodeBlobs
from episode_operator.runtime.fencing import FencedProvider
from episode_operator.runtime.regrade import RegradeRefused, RegradeRunner, RegradeStore, plan_regrade
from episode_operator.taskfolder import TaskFiles

if TYPE_CHECKING:
    from episode_operator.kube.driver import DriverSettings


async def drive_regrade(
    client: KubeClient,
    body: Mapping[str, Any],
    admission: Admission,
    files: TaskFiles,
    status: EpisodeStatus,
    sink: KubeStatusSink,
    settings: DriverSettings,
    observer: EpisodeObserver | None,
    claim: Claim | None,
) -> EpisodeStatus:
    """Run the regrade in ``body`` to its end (or refuse it before any pod)."""
    metadata = body["metadata"]
    episode = OwnerRef(metadata["name"], metadata["namespace"], metadata["uid"])
    spec = admission.spec
    assert spec.regrade is not None
    original_turns: Sequence[TurnStatus] = ()
    regrade = status.regrade
    if regrade is None:
        decided = await decide_regrade(client, settings, episode.namespace, spec.regrade, admission)
        if isinstance(decided, Refusal):
            return await refuse(sink, status, decided, metadata.get("generation"))
        regrade, original_turns = decided
    provider = episode_provider(client, body, admission, files, settings, verifiers_beside_agent=False)
    config = runner_config(admission, files, settings, metadata.get("generation"))
    store = RegradeStore(
        settings.store.episode(episode.namespace, episode.name, episode.uid),
        settings.store.episode(episode.namespace, regrade.episode, regrade.uid),
        regrade.attempt,
    )
    fenced = provider if claim is None else FencedProvider(provider, claim)
    runner = RegradeRunner(
        config,
        fenced,
        sink,
        store,
        regrade=regrade,
        original_turns=original_turns,
        observer=observer,
        builder=settings.builds,
    )
    return await runner.run(status)


async def decide_regrade(
    client: KubeClient, settings: DriverSettings, namespace: str, asked: RegradeSpec, admission: Admission
) -> tuple[RegradeStatus, list[TurnStatus]] | Refusal:
    """What the regrade verifies, from the original as it is now, or why it cannot be regraded."""

    def refused(message: str) -> Refusal:
        return Refusal(FAILURE_REGRADE_REFUSED, f"refused: spec.regrade: {message}", admission.digest)

    try:
        original = await client.get_episode(namespace, asked.episode)
    except NotFound:
        return refused(f"episode {namespace}/{asked.episode} not found")
    uid = original["metadata"]["uid"]
    if asked.uid is not None and asked.uid != uid:
        return refused(
            f"episode {namespace}/{asked.episode} is another Episode now (uid {uid}, not {asked.uid}): the run to "
            "regrade was deleted"
        )
    try:
        recorded = EpisodeStatus.model_validate(original.get("status") or {})
    except ValidationError as error:
        return refused(f"episode {asked.episode}'s status cannot be read: {error}")
    try:
        regrade = plan_regrade(asked.episode, uid, recorded, admission.plan)
    except RegradeRefused as error:
        return refused(str(error))
    kept = settings.store.episode(namespace, asked.episode, uid)
    verified = [turn.name for turn in regrade.turns if turn.action == "verify"]
    missing = [name for name in verified if not await _kept(kept, regrade, name)]
    if missing:
        return refused(
            f"the operator kept no artifacts of turn {', '.join(missing)} of episode {asked.episode} (attempt "
            f"{regrade.attempt}) in {settings.store.where}: nothing to verify again"
        )
    return regrade, list(recorded.turns)


async def _kept(blobs: EpisodeBlobs, regrade: RegradeStatus, turn: str) -> bool:
    """Whether the store holds the turn's artifact manifest (collect writes one, empty or not, every turn)."""
    return await blobs.get(regrade.attempt, turn, ARTIFACTS, MANIFEST) is not None
