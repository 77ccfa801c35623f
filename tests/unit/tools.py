"""Programs the unit tier runs besides Python, found where ``hack/venv`` unpacks them.

``hack/venv`` unpacks Debian's busybox and bubblewrap into ``<venv>/tools/bin``, and installs Debian's
chromium on the machine; a program installed on the machine does too. A test that needs one and finds
neither fails and says how to get it: nothing in the unit tier skips.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

VENV_TOOLS = Path(sys.prefix) / "tools" / "bin"


def tool(name: str) -> str:
    """The path of program ``name`` (``busybox``, ``bwrap``, …); fails the test when there is none."""
    found = shutil.which(name, path=str(VENV_TOOLS)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: run hack/venv (as root for chromium), which provides it", pytrace=False)
    return found
