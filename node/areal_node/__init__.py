"""The areal-console node agent: one standard-library module, shipped over SSH stdio."""

from __future__ import annotations

import os

AGENT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")


def agent_source() -> bytes:
    """The agent program exactly as it is shipped to a node."""
    with open(AGENT_PATH, "rb") as f:
        return f.read()


def agent_hash() -> str:
    import hashlib  # only a remote node's bootstrap needs it (a local capture never does)

    return hashlib.sha256(agent_source()).hexdigest()
