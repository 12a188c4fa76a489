"""Which Python runs a replay on a node, and whether it has torch, before anything starts.

A bare `python3` from the node's PATH is often not the environment the user trains in (a
venv that is not activated in a non-interactive shell): the replay then dies with "No
module named 'torch'" in its log. The node's agent reports its own interpreter and
whether torch imports there; that interpreter is the default wherever it has torch. An
interpreter the user names is checked on the node with a short job first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from areal_node import launcher

from areal_console.core.common.errors import UserError
from areal_console.core.connection.client import AgentDisconnected, AgentError
from areal_console.core.connection.fleet import NodeSession
from areal_console.core.replay.plan import LaunchTemplate

FALLBACK = "python3"
CHECK_KIND = "python-check"  # job metadata kind of a check (the Runs screen leaves it out)
CHECK_CODE = "import torch; print(torch.__version__)"


def uses_python(template: LaunchTemplate) -> bool:
    """Whether the template's command starts with the chosen `{python}`."""
    return any("{python}" in token for token in template.argv)


@dataclass(frozen=True)
class PythonChoice:
    """The interpreter a replay will use on a node, and what is known about it."""

    path: str
    has_torch: bool | None  # None: not known until checked on the node
    why: str  # for the user: where the choice came from

    @property
    def note(self) -> str:
        return f"python: {self.path} ({self.why})"


def agent_python(hello: dict[str, Any]) -> tuple[str | None, bool | None]:
    """The agent's interpreter on the node and whether torch imports there."""
    path = hello.get("python_executable")
    tools = hello.get("tools") if isinstance(hello.get("tools"), dict) else {}
    torch = tools.get("torch") if isinstance(tools, dict) else None
    return (path if isinstance(path, str) and path else None,
            torch if isinstance(torch, bool) else None)  # fmt: skip


def choose_python(hello: dict[str, Any], requested: str | None = None) -> PythonChoice:
    """`requested` when the user named one; else the agent's interpreter where it has
    torch; else `python3` from the node's PATH (checked before launching)."""
    path, torch = agent_python(hello)
    if requested:
        if requested == path:
            return PythonChoice(requested, torch, "the node agent's interpreter")
        return PythonChoice(requested, None, "as given")
    if path and torch:
        return PythonChoice(path, True, "the node agent's interpreter, which has torch")
    why = "the node agent's interpreter has no torch" if path else "the agent did not say"
    return PythonChoice(FALLBACK, None, f"from the node's PATH: {why}")


def check_torch(session: NodeSession, choice: PythonChoice, timeout: float = 60.0) -> None:
    """Raise `UserError` saying what to do when `choice` cannot import torch on the node.

    Known from the agent: no job. Otherwise a short job on the node imports torch with it.
    """
    if choice.has_torch:
        return
    if choice.has_torch is False:
        raise UserError(_no_torch(session.name, choice.path, "torch is not installed there"))
    job_id = time.strftime("check-%Y%m%d-%H%M%S-") + f"{time.monotonic_ns() % 0xFFFFFF:06x}"
    try:
        status = session.call(
            "job_launch",
            {"job": job_id, "argv": launcher.user_code(choice.path, CHECK_CODE), "name": "torch check",
             "meta": {"kind": CHECK_KIND}},
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while status.get("state") == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
            found = session.call("jobs", {"jobs": [job_id]}, timeout=15)["jobs"]
            status = found[0] if found else {"state": "unknown"}
        if status.get("state") == "running":
            session.call("job_stop", {"job": job_id, "grace": 1.0}, timeout=20)
            raise UserError(_no_torch(session.name, choice.path,
                                      f"importing torch took over {timeout:g}s"))  # fmt: skip
        if status.get("exit_code") == 0:
            return
        lines = session.call("job_tail", {"job": job_id, "lines": 5})["lines"]
    except (AgentError, AgentDisconnected, OSError) as exc:
        raise UserError(f"{session.name}: cannot check {choice.path} for torch: {exc}") from None
    last = next((str(line).strip() for line in reversed(lines) if str(line).strip()), "")
    raise UserError(
        _no_torch(session.name, choice.path, last or f"exit code {status.get('exit_code')}")
    )


def _no_torch(node: str, python: str, why: str) -> str:
    return (
        f"{node}: {python} cannot import torch ({why}): pass --python with the interpreter "
        "of the environment that trains (e.g. ~/venv/bin/python)"
    )
