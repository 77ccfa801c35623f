"""The capture store: a folder only the capture container mounts (an emptyDir), holding records and the current turn.

Layout::

    STORE/current-turn.json                    {"attempt": N, "turn": NAME | null}; written by the operator
    STORE/calls/attempt-N/NAME.jsonl           the turn's journal: {"begun": ID} when a call arrives, then
                                               its CapturedCall when it ends (in the order calls end)
    STORE/calls/attempt-N/_outside-turn.jsonl  calls that arrived while no turn was current (kept, flagged)

A call begun and never recorded is in flight (or its proxy died): a harvest waits for it, then says so.

Why a file and not a control port: the agent shares the pod's network namespace, so any port the
proxy listens on, loopback included, is the agent's to call. The operator instead writes the file by
exec into the capture container (``episode-operator capture-turn``), a channel the Kubernetes API
authorises and the agent cannot reach: the folder is mounted in no other container. The same channel
reads a turn's records back (``episode-operator capture-harvest``). Step names are folder names of
letters, digits, ``.``, ``_`` and ``-`` starting with a letter or digit, so ``_outside-turn`` is no turn's.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from episode_operator.capture.records import Begun, CapturedCall, Journal, parse_journal

CURRENT_TURN = "current-turn.json"
# The proxy's bounds on what it stores (``--max-record-bytes``, ``--max-journal-bytes``; the operator's
# ``--capture-max-record-mib`` and ``--capture-max-journal-mib`` set them for every agent pod): a body
# in one record, and everything an attempt's journals hold. The operator reads a turn's journal whole
# (runtime/turn/agent.py), so the journal's bound is also what one harvest may bring into its memory:
# 256 MiB is five times a long turn (100 calls of a 500 KiB conversation).
MAX_RECORD_BYTES = 8 * 1024 * 1024
MAX_JOURNAL_BYTES = 256 * 1024 * 1024
OUTSIDE_TURN = "_outside-turn"
# A safe file name for a turn: step names already are; anything else is refused rather than rewritten.
TURN_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


class CurrentTurn(BaseModel):
    """Which attempt and turn a call arriving now belongs to (``turn`` None: between turns)."""

    attempt: int
    turn: str | None = None


def check_turn_name(turn: str) -> str:
    if not turn or turn[0] in "._-" or not set(turn) <= TURN_NAME_CHARS:
        raise ValueError(
            f"turn name {turn!r} must be letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return turn


def _bucket(turn: str | None) -> str:
    return OUTSIDE_TURN if turn is None else check_turn_name(turn)


def calls_file(attempt: int | None, turn: str | None) -> str:
    """Where a turn's journal lies in the store, relative to its root."""
    return f"calls/attempt-{attempt or 0}/{_bucket(turn)}.jsonl"


@dataclass(frozen=True)
class CaptureStore:
    root: Path

    @property
    def current_turn_path(self) -> Path:
        return self.root / CURRENT_TURN

    def calls_path(self, attempt: int | None, turn: str | None) -> Path:
        return self.root / calls_file(attempt, turn)

    # --- the operator's side (through exec into the capture container) ---------------------------
    def set_current_turn(self, current: CurrentTurn) -> None:
        """Atomically replace the current turn (a rename, so the proxy never reads half a file)."""
        if current.turn is not None:
            check_turn_name(current.turn)
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.current_turn_path.with_name(f".{CURRENT_TURN}.{os.getpid()}")
        temporary.write_text(current.model_dump_json() + "\n")
        temporary.replace(self.current_turn_path)

    def harvest(self, attempt: int, turn: str | None, *, settle_seconds: float = 5.0) -> Harvest:
        """A turn's records once its in-flight calls are stored, waiting at most ``settle_seconds``.

        Call it after the turn's agent exited: a call the agent completed is stored before the agent
        saw its end (the proxy holds the last bytes back until then), and one the agent abandoned is
        stored as ``cancelled`` as soon as the proxy notices the closed connection.
        """
        path = self.calls_path(attempt, turn)
        deadline = time.monotonic() + settle_seconds
        journal = read_journal(path)
        while journal.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
            journal = read_journal(path)
        return Harvest(calls=journal.calls, unreadable_lines=journal.unreadable, still_in_flight=len(journal.in_flight))


class Harvest(BaseModel):
    """A turn's records as ``capture-harvest`` prints them (one JSON document)."""

    calls: list[CapturedCall]
    unreadable_lines: int = Field(default=0, description="Lines that were no record (a write torn by a kill).")
    still_in_flight: int = Field(default=0, description="Calls of the turn still unfinished when the wait ended.")

    @property
    def complete(self) -> bool:
        return not self.unreadable_lines and not self.still_in_flight


def read_journal(path: Path) -> Journal:
    """A turn's records, the calls begun and not yet recorded, and the lines that were neither (a torn write)."""
    try:
        return parse_journal(path.read_bytes())
    except FileNotFoundError:
        return parse_journal(b"")


# --- the proxy's side ------------------------------------------------------------------------------
@dataclass
class TurnTracker:
    """The current turn, re-read only when the file changed (one ``stat`` per call)."""

    store: CaptureStore
    _seen: tuple[int, int, int] | None = None
    _current: CurrentTurn | None = None

    def current(self) -> CurrentTurn | None:
        """None until the operator named an attempt; a file the proxy cannot read counts as no turn."""
        try:
            status = os.stat(self.store.current_turn_path)
        except FileNotFoundError:
            self._seen, self._current = None, None
            return None
        seen = (status.st_ino, status.st_mtime_ns, status.st_size)
        if seen != self._seen:
            try:
                self._current = CurrentTurn.model_validate_json(self.store.current_turn_path.read_bytes())
            except (OSError, ValidationError):
                self._current = None
            self._seen = seen
        return self._current


@dataclass
class CallWriter:
    """Appends to the turns' journals, one ``write`` per line, through descriptors kept open (an ``open`` on a
    busy disk costs as much as the rest of a call); an ``fsync`` after each record when asked.

    It counts what each attempt's journals hold (a journal it opens counts from its size), for the proxy's
    bound on an attempt's journal (``max_journal_bytes``). The agent pod never restarts its capture
    container (``restartPolicy: Never``): one proxy writes an attempt's journals."""

    store: CaptureStore
    fsync: bool = False
    max_journal_bytes: int | None = None
    _files: dict[Path, int] = field(default_factory=dict)
    _journal_bytes: dict[int, int] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def _descriptor(self, attempt: int | None, turn: str | None) -> int:
        path = self.store.calls_path(attempt, turn)
        with self._guard:
            if path not in self._files:
                path.parent.mkdir(parents=True, exist_ok=True)
                descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                self._files[path] = descriptor
                self._journal_bytes[attempt or 0] = self.journal_bytes(attempt) + os.fstat(descriptor).st_size
            return self._files[path]

    def journal_bytes(self, attempt: int | None) -> int:
        """What this attempt's journals hold, as far as this writer opened or wrote them."""
        return self._journal_bytes.get(attempt or 0, 0)

    def full(self, attempt: int | None) -> bool:
        """Whether the attempt's journals reached their bound (a call arriving now is not recorded in full)."""
        if self.max_journal_bytes is None:
            return False
        return self.journal_bytes(attempt) >= self.max_journal_bytes

    def _write(self, attempt: int | None, turn: str | None, line: bytes) -> None:
        descriptor = self._descriptor(attempt, turn)
        self._journal_bytes[attempt or 0] = self.journal_bytes(attempt) + len(line)
        while line:
            line = line[os.write(descriptor, line) :]

    def begin(self, attempt: int | None, turn: str | None, model_call_id: str) -> None:
        """Journal a call's arrival (so a harvest waits for its record)."""
        self._write(attempt, turn, Begun(begun=model_call_id).model_dump_json().encode() + b"\n")

    def append(self, call: CapturedCall) -> None:
        self._write(call.attempt, call.turn, call.model_dump_json(exclude_none=True).encode() + b"\n")
        if self.fsync:
            os.fsync(self._descriptor(call.attempt, call.turn))

    def close(self) -> None:
        with self._guard:
            for descriptor in self._files.values():
                os.close(descriptor)
            self._files.clear()
