"""docs/design/agent-protocol.md documents every op: the agent's op table and the extensions'
(batches, versions), no more and no fewer."""

from __future__ import annotations

import re
from pathlib import Path

from areal_node import versions
from areal_node.agent import protocol, serve
from areal_node.batches.ops import OPS as BATCH_OPS

DOC = Path(__file__).resolve().parents[2] / "docs" / "design" / "agent-protocol.md"
ROW = re.compile(r"^\| `([a-z_]+)` \|", re.MULTILINE)


def documented() -> tuple[set[str], set[str]]:
    """(ops in the agent's table, ops in the extension's table)."""
    text = DOC.read_text()
    core, _, extension = text.partition("Extension ops")
    return set(ROW.findall(core)), set(ROW.findall(extension))


def agent_ops() -> set[str]:
    """The agent's own op table (the `@op(...)` handlers of its modules; `load` may add
    extension ops to the live `OPS` dict of an agent running in this process)."""
    own: set[str] = set()
    for module in Path(serve.__file__).parent.glob("*.py"):
        own |= set(re.findall(r'^@op\("([a-z_]+)"\)$', module.read_text(), re.MULTILINE))
    assert own == set(protocol.known_ops())
    return own


def test_every_agent_op_is_documented() -> None:
    core, _ = documented()
    assert {"hello", "sample", "job_launch", "replay_index"} <= agent_ops()
    assert core == agent_ops()


def test_every_extension_op_is_documented() -> None:
    _, extension = documented()
    assert extension == set(BATCH_OPS) | set(versions.OPS)
    assert not extension & agent_ops()
