"""The Gym environment server: ``POST /run`` and ``POST /aggregate_metrics`` backed by Episodes.

A ``/run`` is one try of one rollout (:mod:`episode_operator.runtime.gym_protocol`): the server creates its
Episode (named from the try, so a re-sent ``/run`` finds the one it made), waits for it to finish
and answers with its row. A client that goes away before the answer cancels the try: its Episode
is deleted. The server stopping does not delete anything; the re-sent ``/run`` (Gym re-sends after
a dropped connection) finds the Episode on whichever replica it reaches.

Authentication: every request carries the server's token, as ``Authorization: Bearer <token>`` or
as the password of HTTP basic authentication. Gym's collector sends no headers of its own, but its
server URL is ``http://{host}:{port}``, so a ``host`` of ``<scope>:<token>@<address>`` makes its
HTTP client send basic authentication. The user name is the **run scope**: tries of the same
rollout in two scopes are two Episodes (a fresh ``gym eval run`` takes a new scope; ``--resume``
keeps its own). A bearer token is scope ``default``.

This module knows no Kubernetes client: the caller passes the :class:`Rollouts` it talks to.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

import yaml
from aiohttp import web
from pydantic import ConfigDict, Field, ValidationError, model_validator

from episode_operator.api.episode_resource import (
    AgentSpec,
    EpisodeSpec,
    HarborSettings,
    RetryPolicy,
    TaskSource,
    episode_manifest,
    validation_message,
)
from episode_operator.api.export import GYM_IDENTITY_ANNOTATION, EpisodeEvidence
from episode_operator.api.vocabulary import (
    FAILURE_INVALID_SPEC,
    FAILURE_TASK_SOURCE,
    GROUP,
    SET_ATTEMPT_LABEL,
    SET_TASK_INDEX_LABEL,
    ApiModel,
)
from episode_operator.runtime.gym_protocol import (
    GymRequestError,
    GymRun,
    ModelCapture,
    RetryOwner,
    TaskRef,
    aggregate_metrics,
    answer,
    cancelled_answer,
    episode_name,
    model_base_url,
    parse_run,
    refused_answer,
)

SCOPE_LABEL = f"{GROUP}/gym-scope"
CAPTURE_KEY_ANNOTATION = f"{GROUP}/gym-capture-key"
DEFAULT_SCOPE = "default"
# A scope is a label value.
SCOPE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
SHUTDOWN_GRACE_S = 2.0


class EpisodeGone(Exception):
    """The Episode of a try was deleted before it finished."""


class RolloutRefused(Exception):
    """The API server refused the Episode of a try (the message says why)."""


class Rollouts(Protocol):
    """What the server needs of the cluster."""

    async def task_source(self, task: TaskRef) -> dict[str, Any] | None:
        """``spec.task`` of a catalogued task (``{"configMap": {...}}``), None when the catalogue has none."""
        ...

    async def create(self, manifest: dict[str, Any]) -> None:
        """Create the Episode; one that exists already is the same try (no error)."""
        ...

    async def finished(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The Episode once it is terminal; :class:`EpisodeGone` if it is deleted first."""
        ...

    async def delete(self, namespace: str, name: str) -> None: ...

    async def evidence(self, episode: Mapping[str, Any]) -> EpisodeEvidence:
        """The captures of the Episode's final attempt (the export's evidence)."""
        ...


@dataclass(frozen=True)
class GymSettings:
    """How the server turns tries into Episodes (the Helm values' ``gym`` block)."""

    namespace: str
    agent: AgentSpec
    token: str = field(repr=False)
    retry_owner: RetryOwner = "gym"
    default_dataset: str | None = None
    # Gym's model server: the agent's calls go to <it>/ng-rollout/<capture key>/v1, so Gym's own capture
    # sees them too (the operator's capture proxy stays in between).
    model_server: str | None = None
    model_server_capture: ModelCapture = "evaluation"
    image: str | None = None
    timeout_multiplier: float = 1.0
    harbor: HarborSettings = field(default_factory=HarborSettings)


class HarborSettingsFile(HarborSettings):
    """``harbor`` of the ``--gym-settings`` file: an Episode's ``spec.harbor``, but a key the model does not
    know, or a value of another type ("yes" for a boolean), is refused, not dropped as the API server prunes."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GymServerFile(ApiModel):
    """The ``--gym-settings`` file (the Helm values' ``gym`` block, camelCase); a key it does not know is
    refused, naming it (a misspelled setting would otherwise be silently the default)."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(min_length=1, description="Where the tries' Episodes are made and the catalogue is.")
    agent: AgentSpec = Field(description="What acts in each try's sandbox (an Episode's spec.agent).")
    retry_owner: RetryOwner = Field(
        default="gym", description="gym: an outage answers a failure Gym retries; operator: the Episode retries it."
    )
    default_dataset: str | None = Field(default=None, description="The dataset of a task named without one.")
    model_server: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+/?$",
        description="Gym's model server (http://host:port): calls go to <it>/ng-rollout/<capture key>/v1.",
    )
    model_server_capture: ModelCapture = Field(
        default="evaluation",
        description="Which of Gym's captures records the calls at its model server, as its run's token_id_capture "
        "says: evaluation (<it>/ng-rollout/<key>/v1) or training (<it>/ng-rollout/<key>/training-token-capture/v1).",
    )
    image: str | None = Field(default=None, description="A prebuilt sandbox image for every try (spec.image).")
    timeout_multiplier: float = Field(default=1.0, gt=0, le=100, description="spec.timeoutMultiplier of every try.")
    harbor: HarborSettingsFile = Field(
        default_factory=HarborSettingsFile, description="Gym's harbor server settings: spec.harbor of every try."
    )

    @model_validator(mode="after")
    def _capture_needs_the_model_server(self) -> Self:
        if self.model_server_capture != "evaluation" and self.model_server is None:
            raise ValueError(
                f"modelServerCapture: {self.model_server_capture} is a capture of Gym's model server: "
                "name it in modelServer"
            )
        return self


# Where the chart's values put the server's harbor settings (helm/episode-operator/values.yaml).
HARBOR_VALUES = "gym.settings.harbor"


def render_harbor_table() -> str:
    """The README's table of Gym's harbor server settings, from :class:`HarborSettings` itself: each one's
    Helm value, Episode field, default and meaning (``tests/doc_tables.py``; a unit test fails when the
    README's copy drifts)."""
    defaults = HarborSettings()
    lines = ["| Helm value | Episode field | default | meaning |", "| --- | --- | --- | --- |"]
    for name, setting in HarborSettings.model_fields.items():
        key = setting.alias or name
        value = getattr(defaults, name)
        shown = json.dumps(int(value) if isinstance(value, float) and value.is_integer() else value)
        lines.append(f"| `{HARBOR_VALUES}.{key}` | `spec.harbor.{key}` | `{shown}` | {setting.description} |")
    return "\n".join(lines) + "\n"


def load_settings(text: str, token: str, where: str) -> GymSettings:
    """The server's settings from the ``--gym-settings`` file; ValueError naming the file and key."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"{where}: not YAML: {error}") from error
    try:
        parsed = GymServerFile.model_validate(document)
    except ValidationError as error:
        raise ValueError(f"{where}: {validation_message(error).replace('spec.', '', 1)}") from error
    if not token:
        raise ValueError("the Gym server needs a token (--gym-token-file, or EPISODE_GYM_TOKEN)")
    fields = dict(parsed) | {"harbor": HarborSettings(**dict(parsed.harbor))}
    return GymSettings(token=token, **fields)  # the same fields, the token besides


def scope_of(request: web.Request, token: str) -> str:
    """The run scope of an authenticated request; 401 otherwise."""
    header = request.headers.get("Authorization", "")
    kind, _, credentials = header.partition(" ")
    scope, given = DEFAULT_SCOPE, ""
    if kind.lower() == "bearer":
        given = credentials.strip()
    elif kind.lower() == "basic":
        try:
            scope, _, given = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            given = ""
    if not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise web.HTTPUnauthorized(
            text=json.dumps(
                {"detail": "the server's token is needed: Authorization: Bearer <token>, or <scope>:<token>@host"}
            ),
            content_type="application/json",
            headers={"WWW-Authenticate": 'Basic realm="episode-operator gym"'},
        )
    if not SCOPE.match(scope or DEFAULT_SCOPE):
        raise _unprocessable(f"the run scope (the user name) {scope!r}: letters, digits, '-', '_', '.', up to 63")
    return scope or DEFAULT_SCOPE


def _unprocessable(detail: str) -> web.HTTPUnprocessableEntity:
    return web.HTTPUnprocessableEntity(text=json.dumps({"detail": detail}), content_type="application/json")


def try_manifest(settings: GymSettings, scope: str, run: GymRun, source: Mapping[str, Any]) -> dict[str, Any]:
    """The Episode of a try."""
    agent = settings.agent
    if settings.model_server and agent.model is not None:
        routed = model_base_url(settings.model_server, run.capture_key, settings.model_server_capture)
        agent = agent.model_copy(update={"model": agent.model.model_copy(update={"base_url": routed})})
    spec = EpisodeSpec(
        task=TaskSource.model_validate(source),
        agent=agent,
        image=settings.image,
        timeout_multiplier=settings.timeout_multiplier,
        harbor=settings.harbor,
        # One side retries outages: Gym dispatches the next attempt itself, or the operator retries within.
        retries=RetryPolicy(outages=0) if settings.retry_owner == "gym" else RetryPolicy(),
    )
    labels = {SCOPE_LABEL: scope}
    if run.task_index is not None and run.rollout_index is not None:
        # As an EpisodeSet's children: the export's rollout ids and indices are Gym's.
        labels |= {SET_TASK_INDEX_LABEL: str(run.task_index), SET_ATTEMPT_LABEL: str(run.rollout_index + 1)}
    manifest = episode_manifest(settings.namespace, spec, name=episode_name(scope, run), labels=labels)
    manifest["metadata"]["annotations"] = {
        CAPTURE_KEY_ANNOTATION: run.capture_key,
        # The rows `kubectl episode export` writes of it carry what Gym named the try by.
        GYM_IDENTITY_ANNOTATION: json.dumps(run.identity, sort_keys=True),
    }
    return manifest


@dataclass
class GymServer:
    """The ``/run`` handler's state: settings, the cluster, and whether the server is stopping."""

    settings: GymSettings
    rollouts: Rollouts
    stopping: bool = False

    async def run(self, request: web.Request) -> web.Response:
        scope = scope_of(request, self.settings.token)
        try:
            body = await request.json()
        except ValueError as error:
            raise _unprocessable(f"the body is not JSON: {error}") from error
        try:
            run = parse_run(body, self.settings.default_dataset)
        except GymRequestError as error:
            raise _unprocessable(str(error)) from error
        source = await self.rollouts.task_source(run.task)
        if source is None:
            reason = f"dataset {run.task.dataset!r} has no task {run.task.task!r} in the operator's catalogue"
            return web.json_response(refused_answer(run, reason, FAILURE_TASK_SOURCE))
        manifest = try_manifest(self.settings, scope, run, source)
        name = manifest["metadata"]["name"]
        try:
            await self.rollouts.create(manifest)
        except RolloutRefused as error:
            return web.json_response(refused_answer(run, f"episode {name}: {error}", FAILURE_INVALID_SPEC))
        try:
            episode = await self.rollouts.finished(self.settings.namespace, name)
        except EpisodeGone:
            return web.json_response(cancelled_answer(run, f"episode {name} was deleted before it finished"))
        except asyncio.CancelledError:
            if not self.stopping:  # the client went away: Gym cancelled the try
                await asyncio.shield(self.rollouts.delete(self.settings.namespace, name))
            raise
        evidence = await self.rollouts.evidence(episode)
        return web.json_response(answer(run, episode, evidence, self.settings.retry_owner))

    async def aggregate(self, request: web.Request) -> web.Response:
        scope_of(request, self.settings.token)
        try:
            body = await request.json()
        except ValueError as error:
            raise _unprocessable(f"the body is not JSON: {error}") from error
        responses = body.get("verify_responses") if isinstance(body, Mapping) else None
        if not isinstance(responses, list):
            raise _unprocessable("verify_responses: a list of the rows Gym kept")
        try:
            return web.json_response(aggregate_metrics(responses))
        except GymRequestError as error:
            raise _unprocessable(str(error)) from error


def application(server: GymServer) -> web.Application:
    """The aiohttp application (separate from serving it, for tests)."""

    async def stopping(_: web.Application) -> None:
        server.stopping = True

    async def alive(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.on_shutdown.append(stopping)
    app.router.add_post("/run", server.run)
    app.router.add_post("/aggregate_metrics", server.aggregate)
    app.router.add_get("/", alive)  # Gym's collector polls a server's root before it dispatches
    return app


async def serve(server: GymServer, host: str, port: int) -> web.AppRunner:
    """Start serving; the caller keeps the runner and cleans it up at shutdown.

    ``handler_cancellation``: a client that disconnects cancels its ``/run`` (and so its Episode). A
    stopping server does not wait for the ``/run``s in flight (they wait for whole Episodes): it
    closes their connections after ``SHUTDOWN_GRACE_S``, and Gym sends them again.
    """
    runner = web.AppRunner(
        application(server), access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_GRACE_S
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
