"""Headless Chromium (Debian's ``chromium``, which ``hack/venv`` installs) loading a page once: its DOM as
the page's scripts, if any ran, left it, and a screenshot.

Each run gets a new empty profile and the flags that keep it off the network beyond the page it loads
(no QUIC, no background fetches, no component updates, no sync). It runs in a process group of its
own, so that a run that hangs is stopped whole — the browser and its helper processes — by that
group's id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.unit.tools import tool

FLAGS = (
    "--headless",
    "--no-sandbox",  # the tests run as root, where Chromium's own sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
TIMEOUT_SEC = 120


@dataclass(frozen=True)
class Loaded:
    dom: str
    screenshot: Path


def load(url: str, screenshot: Path, *, width: int = 1200, height: int = 1600) -> Loaded:
    """Load ``url``; its DOM after loading and a ``width``×``height`` screenshot of it at ``screenshot``."""
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        process = subprocess.Popen(
            [
                tool("chromium"),
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--screenshot={screenshot}",
                "--dump-dom",
                url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            dom, errors = process.communicate(timeout=TIMEOUT_SEC)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert process.returncode == 0, f"chromium exited {process.returncode}: {errors[-2000:]}"
    assert screenshot.is_file(), f"chromium wrote no screenshot: {errors[-2000:]}"
    return Loaded(dom, screenshot)
