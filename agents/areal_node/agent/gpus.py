"""GPUs through NVML (optional): `pynvml` is imported on first use, its absence is data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _nvml_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuCollector:
    """NVML, imported and initialised on first use; absence is an error string, not a crash."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._error: str | None = None
        self._tried = False

    def _init(self) -> Any:
        if self._tried:
            return self._nvml
        self._tried = True
        try:
            import pynvml
        except ImportError:
            self._error = "NVML unavailable: pynvml is not installed (pip install nvidia-ml-py)"
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # pynvml.NVMLError and loader errors
            self._error = f"NVML unavailable: {_nvml_error_text(exc)}"
            return None
        self._nvml = pynvml
        return pynvml

    def available(self) -> tuple[bool, str | None]:
        return self._init() is not None, self._error

    def collect(
        self,
    ) -> tuple[list[dict[str, Any]], dict[int, list[tuple[int, int | None]]], str | None]:
        nvml = self._init()
        if nvml is None:
            return [], {}, self._error
        gpus: list[dict[str, Any]] = []
        per_pid: dict[int, list[tuple[int, int | None]]] = {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            return [], {}, f"NVML error: {_nvml_error_text(exc)}"
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                gpus.append(
                    {
                        "index": index,
                        "name": None,
                        "uuid": None,
                        "util": None,
                        "mem_used": None,
                        "mem_total": None,
                        "temp": None,
                        "power": None,
                        "error": _nvml_error_text(exc),
                    }
                )
                continue
            gpus.append(self._gpu_record(nvml, index, handle))
            for pid, mem in self._gpu_processes(nvml, handle):
                per_pid.setdefault(pid, []).append((index, mem))
        return gpus, per_pid, None

    @staticmethod
    def _gpu_record(nvml: Any, index: int, handle: Any) -> dict[str, Any]:
        def field(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception:
                return None  # NotSupported on this device or driver

        mem = field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = field(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return {
            "index": index,
            "name": field(lambda: _nvml_str(nvml.nvmlDeviceGetName(handle))),
            "uuid": field(lambda: _nvml_str(nvml.nvmlDeviceGetUUID(handle))),
            "util": field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "mem_used": getattr(mem, "used", None),
            "mem_total": getattr(mem, "total", None),
            "temp": field(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            "power": round(power_mw / 1000.0, 1) if power_mw is not None else None,
        }

    @staticmethod
    def _gpu_processes(nvml: Any, handle: Any) -> list[tuple[int, int | None]]:
        """Compute and graphics processes, trying the versioned symbols real drivers need."""
        out: dict[int, int | None] = {}
        for kind in ("Compute", "Graphics"):
            for suffix in ("_v3", "_v2", ""):
                fn = getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses{suffix}", None)
                if fn is None:
                    continue
                try:
                    infos = fn(handle)
                except Exception as exc:
                    if _is_function_not_found(nvml, exc):
                        continue  # older driver: try the next symbol version
                    break
                for info in infos:
                    mem = getattr(info, "usedGpuMemory", None)
                    # NVML reports "not available" (e.g. in containers) as a huge sentinel.
                    if mem is not None and mem >= 2**63:
                        mem = None
                    out[int(info.pid)] = mem
                break
        return list(out.items())


def _nvml_error_text(exc: Exception) -> str:
    text = str(exc).strip()
    return text or exc.__class__.__name__


def _is_function_not_found(nvml: Any, exc: Exception) -> bool:
    code = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
    return getattr(exc, "value", None) == code or isinstance(exc, AttributeError)
