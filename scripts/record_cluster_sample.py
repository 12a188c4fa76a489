"""Record the Cluster screen's fixture: real agent samples of a real 4-rank gloo job.

This machine has no GPU, so NVML is answered by pynvml with its device functions patched to
describe H100s (the same patching the NVML tests use); processes, ranks, CPU and memory are
real. PIDs and host names are renumbered so the snapshot is deterministic, and machine
paths (the checkout, the interpreter, temporary directories) rewritten to a neutral root
(tests/support/fixtures/neutral_paths.py).

    python scripts/record_cluster_sample.py tests/data/cluster_recording.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents"), str(ROOT / "tests")]

from areal_node.agent.serve import Agent  # noqa: E402
from conftest import GlooJob  # noqa: E402
from fixtures.neutral_paths import neutral  # noqa: E402

GiB = 2**30


def patch_nvml(gpu_pids: dict[int, int]) -> None:
    utils = [97, 95, 98, 96, 0, 0, 0, 0]
    pynvml.nvmlInit = lambda: None
    pynvml.nvmlDeviceGetCount = lambda: 8
    pynvml.nvmlDeviceGetHandleByIndex = lambda i: i
    pynvml.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    pynvml.nvmlDeviceGetUUID = lambda h: f"GPU-5f0c{h:04d}-aaaa-bbbb-cccc-00000000000{h}"
    pynvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=utils[h], memory=0)
    pynvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(
        used=(62 if h < 4 else 0.5) * GiB, total=80 * GiB, free=18 * GiB
    )
    pynvml.nvmlDeviceGetTemperature = lambda h, s: 67 if h < 4 else 31
    pynvml.nvmlDeviceGetPowerUsage = lambda h: 610_000 if h < 4 else 72_000
    by_gpu = {g: p for p, g in gpu_pids.items()}

    def procs(h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=by_gpu[h], usedGpuMemory=61 * GiB)] if h in by_gpu else []

    pynvml.nvmlDeviceGetComputeRunningProcesses_v3 = procs
    pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3 = lambda h: []


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job = GlooJob(4, Path(tmp), port=29655)
        try:
            ranks = job.rank_pids()
            patch_nvml({pid: rank for rank, pid in ranks.items()})
            agent = Agent(stdin=None, stdout=subprocess.DEVNULL)
            agent.sample()
            time.sleep(1.0)
            sample = agent.sample()
        finally:
            job.stop()
    keep = set(ranks.values()) | {job.launcher_pid}
    renumber = {pid: 4100 + i for i, pid in enumerate(sorted(keep))}
    procs = []
    for p in sample["processes"]:
        if p["pid"] not in keep:
            continue
        p["pid"] = renumber[p["pid"]]
        p["ppid"] = renumber.get(p["ppid"], 1)
        p["cpu_percent"] = 0.0
        procs.append(p)
    sample["processes"] = procs
    sample["hostname"] = "node1"
    sample["time"] = 0
    sample = neutral(sample)
    Path(out).write_text(json.dumps(sample, indent=1) + "\n")
    print(f"wrote {out}: {len(procs)} processes, {len(sample['gpus'])} GPUs")


if __name__ == "__main__":
    main(sys.argv[1])
