"""``${VAR}`` templates in ``env`` tables (Harbor's ``resolve_env_vars``).

A value that is *entirely* ``${VAR}`` or ``${VAR:-default}`` is read from the host at run
time; any other value, including one with a template inside it, is a literal. Harbor's
host is the machine running the trial. The operator does not hand its own environment to
tasks: the values come from the Episode (its agent's literal ``env`` entries), so a task
folder cannot read the operator's secrets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

TEMPLATE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\}$", re.DOTALL)


class UnresolvedTemplate(ValueError):
    """A ``${VAR}`` without a default whose VAR the Episode does not provide."""


def resolve_env_templates(env: Mapping[str, str], source: Mapping[str, str]) -> dict[str, str]:
    """``env`` with whole-value templates resolved from ``source``; raises on the unresolvable."""
    resolved: dict[str, str] = {}
    missing: list[str] = []
    for name, value in env.items():
        match = TEMPLATE.match(value)
        if match is None:
            resolved[name] = value
        elif match.group(1) in source:
            resolved[name] = source[match.group(1)]
        elif match.group(2) is not None:
            resolved[name] = match.group(2)
        else:
            missing.append(f"{name} = {value}")
    if missing:
        raise UnresolvedTemplate(
            f"{', '.join(missing)}: no value; give it in the Episode's spec.agent.env or add a default (${{VAR:-x}})"
        )
    return resolved
