"""Deterministic Cluster data for snapshots and screenshots, from a recorded agent sample."""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

from areal_console.core.monitor import HISTORY, NodeView, RecordedMonitor

DATA = Path(__file__).resolve().parent / "data"


def recorded_views() -> list[NodeView]:
    sample = json.loads((DATA / "cluster_recording.json").read_text())
    history = {
        g["index"]: deque(
            [
                round(g["util"] * (0.75 + 0.25 * math.sin(i / 3 + g["index"])))
                for i in range(HISTORY)
            ],
            maxlen=HISTORY,
        )
        for g in sample["gpus"]
    }
    up = NodeView("node1", "alice@127.0.0.2:2201", "up", None, 0.004, sample, 0.0, history,
                  {"hostname": "node1", "python": "3.11.7"})  # fmt: skip
    down = NodeView("node2", "alice@127.0.0.3:2201", "down",
                    "connection refused (127.0.0.3:2201): is sshd running?")  # fmt: skip
    return [up, down]


def recorded_monitor() -> RecordedMonitor:
    return RecordedMonitor(recorded_views())
