"""The agent's NVML path through pynvml's own API: real absence here, patched devices."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pynvml
import pytest
from areal_node.agent.gpus import GpuCollector
from areal_node.agent.processes import process_record

GiB = 2**30


def test_real_absence_is_a_plain_error() -> None:
    # This machine has no NVIDIA driver: the real library load fails and says so.
    gpus, per_pid, error = GpuCollector().collect()
    assert gpus == [] and per_pid == {}
    assert error == "NVML unavailable: NVML Shared Library Not Found"


def test_missing_module_is_a_plain_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    gpus, _, error = GpuCollector().collect()
    assert gpus == []
    assert error == "NVML unavailable: pynvml is not installed (pip install nvidia-ml-py)"


class FakeDevices:
    """Two H100s as a driver would describe them; process lists by symbol version."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, has_v3: bool) -> None:
        self.handles = ["h0", "h1"]
        m = monkeypatch
        m.setattr(pynvml, "nvmlInit", lambda: None)
        m.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
        m.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: self.handles[i])
        m.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA H100 80GB HBM3")
        m.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
        m.setattr(
            pynvml,
            "nvmlDeviceGetUtilizationRates",
            lambda h: SimpleNamespace(gpu=97 if h == "h0" else 3, memory=40),
        )
        m.setattr(
            pynvml,
            "nvmlDeviceGetMemoryInfo",
            lambda h: SimpleNamespace(used=61 * GiB, total=80 * GiB, free=19 * GiB),
        )
        m.setattr(pynvml, "nvmlDeviceGetTemperature", lambda h, sensor: 64)
        m.setattr(pynvml, "nvmlDeviceGetPowerUsage", self._power)

        def procs(h: str) -> list[SimpleNamespace]:
            pid = 1000 if h == "h0" else 1001
            return [SimpleNamespace(pid=pid, usedGpuMemory=60 * GiB)]

        def not_found(h: str) -> list[SimpleNamespace]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        m.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v3", procs if has_v3 else not_found)
        m.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2", procs)
        m.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses_v3", lambda h: [])
        m.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses_v2", lambda h: [])

    @staticmethod
    def _power(h: str) -> int:
        if h == "h1":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 512_345  # milliwatts


@pytest.mark.parametrize("has_v3", [True, False], ids=["v3", "v3-missing-falls-back-to-v2"])
def test_devices_and_per_process_memory(monkeypatch: pytest.MonkeyPatch, has_v3: bool) -> None:
    FakeDevices(monkeypatch, has_v3)
    gpus, per_pid, error = GpuCollector().collect()
    assert error is None
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-h0",
        "util": 97,
        "mem_used": 61 * GiB,
        "mem_total": 80 * GiB,
        "temp": 64,
        "power": 512.3,
    }
    assert gpus[1]["power"] is None  # NotSupported on that device: a missing field, not an error
    assert per_pid == {1000: [(0, 60 * GiB)], 1001: [(1, 60 * GiB)]}
    record = process_record(
        {
            "pid": 1001,
            "ppid": 1,
            "comm": "python",
            "cmdline": ["python", "train.py"],
            "env": {"RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1"},
            "env_error": None,
            "cpu_percent": 99.0,
            "state": "R",
            "role": "trainer",
        },
        rss=GiB,
        gpu_use=per_pid,
    )
    assert record["gpus"] == [1] and record["gpu_memory"] == 60 * GiB


def test_init_failure_names_the_driver_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    _, _, error = GpuCollector().collect()
    assert error == "NVML unavailable: Driver Not Loaded"


def test_without_nvml_gpus_come_from_cuda_visible_devices() -> None:
    record = process_record(
        {
            "pid": 5,
            "ppid": 1,
            "comm": "python",
            "cmdline": ["python"],
            "env": {"CUDA_VISIBLE_DEVICES": "4,5"},
            "env_error": None,
            "cpu_percent": None,
            "state": "S",
        },
        rss=None,
        gpu_use={},
    )
    assert record["gpus"] == [4, 5] and record["gpu_memory"] is None
