"""The areal-console node agent: one standard-library module, shipped over SSH stdio."""

from __future__ import annotations

import hashlib
from pathlib import Path

AGENT_PATH = Path(__file__).with_name("agent.py")


def agent_source() -> bytes:
    """The agent program exactly as it is shipped to a node."""
    return AGENT_PATH.read_bytes()


def agent_hash() -> str:
    return hashlib.sha256(agent_source()).hexdigest()
