"""``episode-operator capture-*``: the capture container's commands (the proxy, and the operator's exec hooks)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import click

from episode_operator.capture.capture_store import MAX_JOURNAL_BYTES, MAX_RECORD_BYTES, CaptureStore, CurrentTurn
from episode_operator.capture.wire import KEY_ENV, is_ip_address

store_option = click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The capture store: an emptyDir mounted in the capture container only.",
)


def listen_address(_context: click.Context, _parameter: click.Parameter, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def _params(text: str) -> dict[str, Any]:
    try:
        params = json.loads(text)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="--params") from error
    if not isinstance(params, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--params")
    return params


@click.command("capture-proxy")
@click.option(
    "--listen",
    callback=listen_address,
    default="127.0.0.1:8321",
    show_default=True,
    help="HOST:PORT; loopback is the agent's own, since containers of a pod share its network.",
)
@click.option(
    "--upstream", required=True, help="The model's base URL as a client would use it, e.g. https://api.openai.com/v1."
)
@click.option(
    "--upstream-address",
    "upstream_addresses",
    multiple=True,
    help="An IP address of the upstream's host, resolved by the operator (repeatable): the only addresses "
    "connected to. The hostname is never resolved here (the pod's /etc/hosts is the agent's to rewrite); "
    "needed unless the upstream's host is an IP address.",
)
@store_option
@click.option(
    "--api-key-env",
    default=KEY_ENV,
    show_default=True,
    help="Environment variable holding the real key (set from the Secret); empty or unset: no key is sent.",
)
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds.")
@click.option(
    "--read-timeout",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="Longest silence from upstream, before or during an answer, in seconds.",
)
@click.option(
    "--max-call-seconds",
    type=click.FloatRange(min=0.1),
    default=1800.0,
    show_default=True,
    help="No call is held open longer than this.",
)
@click.option(
    "--max-record-bytes",
    type=click.IntRange(min=1024),
    default=MAX_RECORD_BYTES,
    show_default=True,
    help="A request or response body past this is forwarded whole and recorded as its first bytes.",
)
@click.option(
    "--max-journal-bytes",
    type=click.IntRange(min=1024),
    default=MAX_JOURNAL_BYTES,
    show_default=True,
    help="An attempt's journal bound: past it calls are answered locally (400 capture_limit), not forwarded.",
)
@click.option("--token-ids", is_flag=True, help="Ask a vLLM upstream for token ids and logprobs (capture.tokenIds).")
@click.option(
    "--params",
    "params_json",
    default="{}",
    show_default=True,
    help="A JSON object set on every model call over what the agent sent (spec.agent.model.params).",
)
@click.option(
    "--fsync",
    is_flag=True,
    help="fsync each record before the client sees the call end. Off: an emptyDir dies with its pod, so a "
    "record written to the page cache is as lasting as the store itself (and a disk flush costs ms per call).",
)
def capture_proxy(
    listen: tuple[str, int],
    upstream: str,
    upstream_addresses: tuple[str, ...],
    store: Path,
    api_key_env: str,
    connect_timeout: float,
    read_timeout: float,
    max_call_seconds: float,
    token_ids: bool,
    params_json: str,
    fsync: bool,
    max_record_bytes: int,
    max_journal_bytes: int,
) -> None:
    """Forward model calls to UPSTREAM and record every exchange in the store."""
    # Imported here: the operator execs capture-turn and capture-harvest twice a turn, and they need no aiohttp.
    from episode_operator.capture.proxy import ProxyConfig, serve

    config = ProxyConfig(
        upstream=upstream,
        upstream_addresses=upstream_addresses,
        store=store,
        api_key=os.environ.get(api_key_env) or None,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_call_seconds=max_call_seconds,
        token_ids=token_ids,
        params=_params(params_json),
        fsync=fsync,
        max_record_bytes=max_record_bytes,
        max_journal_bytes=max_journal_bytes,
    )
    try:
        config.origin  # noqa: B018 - validates the URL and the addresses before listening
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--upstream") from error
    if not upstream_addresses and not is_ip_address(config.hostname):
        raise click.BadParameter(
            f"the upstream's host {config.hostname} is not an IP address: give the addresses it resolves to",
            param_hint="--upstream-address",
        )
    host, port = listen
    asyncio.run(serve(config, host, port))


@click.command("capture-turn")
@store_option
@click.option("--attempt", type=click.IntRange(min=1), required=True)
@click.option("--turn", default=None, help="The turn whose calls arrive from now on; omitted: between turns.")
def capture_turn(store: Path, attempt: int, turn: str | None) -> None:
    """Name the current attempt and turn (run by the operator through exec into the capture container)."""
    try:
        CaptureStore(store).set_current_turn(CurrentTurn(attempt=attempt, turn=turn))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--turn") from error


@click.command("capture-harvest")
@store_option
@click.option("--attempt", type=click.IntRange(min=1), required=True)
@click.option("--turn", default=None, help="The turn to read; omitted: the calls that arrived between turns.")
@click.option(
    "--settle",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the turn's calls still in flight.",
)
def capture_harvest(store: Path, attempt: int, turn: str | None, settle: float) -> None:
    """Print a turn's records as one JSON document ({calls, unreadable_lines, still_in_flight})."""
    try:
        harvest = CaptureStore(store).harvest(attempt, turn, settle_seconds=settle)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--turn") from error
    click.echo(harvest.model_dump_json(exclude_none=True))


COMMANDS = (capture_proxy, capture_turn, capture_harvest)
