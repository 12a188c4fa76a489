"""areal-console node agent.

One standard-library-only module, shipped to each node over SSH stdio (or run as a local
subprocess) and executed with the node's `python3`. It speaks JSON lines:

    request  {"id": 1, "op": "sample", "args": {...}}
    reply    {"id": 1, "ok": true, "result": {...}}  or  {"id": 1, "ok": false, "error": "..."}
    event    {"event": "sample", ...}                 (streams, job exits, log lines)

It never listens on a socket. `pynvml` and `torch` are imported lazily, and their absence
is reported as data. Unknown ops and malformed lines answer an error; EOF on stdin exits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

PROTOCOL_VERSION = 1
AGENT_VERSION = "0.1.0"

# Environment variables that identify a rank of a distributed job.
RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    # Ranks set by other launchers: Slurm (`srun python ...`), Open MPI, MPICH/Intel MPI.
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
)

# AReaL single-controller workers (`python3 -m areal.infra.rpc.rpc_server --role R
# --worker-index N ...`, areal/infra/scheduler/local.py:777-814 at AReaL cbff54d6). RANK,
# WORLD_SIZE and MASTER_* reach them later over HTTP (`POST /set_env`), never in their
# /proc environment; the controller sets RANK = the worker's index in its role
# (areal/infra/controller/train_controller.py:336-343).
RPC_SERVER_MODULE = "areal.infra.rpc.rpc_server"
TRAINING_ROLES = frozenset({"actor", "ref", "critic", "teacher"})
AREAL_ROLES = TRAINING_ROLES | {"rollout", "eval-rollout", "data", "proxy-rollout"}
# Inference servers: module -> (kind, default port). AReaL builds their command lines with
# `get_py_cmd(module, args)` (areal/api/cli_args.py:2007-2022, 2121, 2255); both remote
# engines check health with `GET /health` (areal/engine/sglang_remote.py:374-376,
# areal/engine/vllm_remote.py:258-260).
SERVER_MODULES = {
    "areal.v2.inference_service.sglang.launch_server": ("sglang", 30000),
    "areal.experimental.inference_service.sglang.launch_server": ("sglang", 30000),
    "areal.engine.awex.sglang_plugin": ("sglang", 30000),
    "sglang.launch_server": ("sglang", 30000),
    "areal.engine.vllm_ext.areal_vllm_server": ("vllm", 8000),
    "vllm.entrypoints.openai.api_server": ("vllm", 8000),
}
HEALTH_PATH = "/health"
HEALTH_TIMEOUT = 1.0  # seconds per poll
HEALTH_TTL = 3.0  # a poll younger than this is reused
# Programs that only wrap a worker: LocalScheduler runs each one as `/bin/bash -c "ENV
# stdbuf -oL python3 -m ... 2>&1 | tee -a LOG >(stdbuf -oL sed ... >> merged.log)"`
# (areal/infra/utils/proc.py:26-121).
WRAPPER_EXES = frozenset(
    {"bash", "sh", "dash", "zsh", "stdbuf", "tee", "sed", "env", "nohup", "setsid", "timeout"}
)

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
YOUNG_SECONDS = 3.0
FULL_SAMPLE_EVERY = 10  # every Nth sample reads every process's stat again


class OpError(Exception):
    """An error reply: the request was understood but cannot be served."""


Handler = Callable[["Agent", dict], Any]
OPS: dict[str, Handler] = {}


def op(name: str) -> Callable[[Handler], Handler]:
    """Register a request handler under `name`."""

    def register(func: Handler) -> Handler:
        OPS[name] = func
        return func

    return register


# --------------------------------------------------------------------------------------
# Threads (concurrent.futures would do, but its imports alone cost a one-shot capture 5 ms)

T = TypeVar("T")
R = TypeVar("R")


class Workers:
    """Runs submitted calls on at most `limit` threads, started as they are needed.

    `shutdown()` ends the threads once the queued calls ran (`cancel=True`: once the
    running ones did); with `wait`, it returns when they have ended."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit = max(1, limit)
        self._name = name
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call, not yet woken for one
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name}: no calls after shutdown")
            self._calls.append((fn, args))
            if self._idle:
                self._idle -= 1
                self._cond.notify()
            elif len(self._threads) < self._limit:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError:  # the interpreter is exiting: keep nothing of this call
                    self._calls.pop()
                    raise
                self._threads.append(thread)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                if not self._calls:
                    return
                fn, args = self._calls.popleft()
            fn(*args)

    def shutdown(self, wait: bool = True, cancel: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel:
                self._calls.clear()
            self._cond.notify_all()
        if wait:
            for thread in list(self._threads):
                if thread is not threading.current_thread():
                    thread.join()


def parallel_map(fn: Callable[[T], R], items: Iterable[T], limit: int) -> list[R]:
    """`[fn(x) for x in items]`, on up to `limit` threads; in order. The first exception
    any call raised is raised here (after the others ran); one item runs inline."""
    todo = list(items)
    if len(todo) <= 1 or limit <= 1:
        return [fn(x) for x in todo]
    results: list[Any] = [None] * len(todo)
    errors: list[BaseException] = []
    next_index = iter(range(len(todo)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                results[i] = fn(todo[i])
            except BaseException as exc:  # handed to the caller
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(limit, len(todo)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


# --------------------------------------------------------------------------------------
# /proc readers


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_small(path: str) -> bytes:
    """A one-line /proc file (stat, statm): one read, unless it fills the buffer."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, 4096)
        if len(data) < 4096:
            return data
        chunks = [data]
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def parse_stat(raw: bytes) -> tuple[str, str, int, int, int]:
    """(comm, state, ppid, cpu_ticks, start_ticks) from /proc/PID/stat."""
    # comm may hold spaces and parentheses: split at the last ')'.
    close = raw.rindex(b")")
    comm = raw[raw.index(b"(") + 1 : close].decode(errors="replace")
    fields = raw[close + 2 :].split()
    state = fields[0].decode()
    ppid = int(fields[1])
    cpu_ticks = int(fields[11]) + int(fields[12])
    start_ticks = int(fields[19])
    return comm, state, ppid, cpu_ticks, start_ticks


def parse_environ(raw: bytes, wanted: tuple[str, ...] = RANK_VARS) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            name = key.decode(errors="replace")
            if name in wanted:
                env[name] = value.decode(errors="replace")
    return env


def _to_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def is_python(cmdline: list[str], comm: str) -> bool:
    exe = os.path.basename(cmdline[0]) if cmdline else comm
    return (
        exe.startswith("python")
        or comm.startswith("python")
        or comm in ("pt_main_thread", "torchrun")
    )


def flag_value(cmdline: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` on a command line (the last one wins)."""
    found = None
    for i, arg in enumerate(cmdline):
        if arg == name and i + 1 < len(cmdline):
            found = cmdline[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def python_module(cmdline: list[str]) -> str | None:
    """The module a Python command line runs with `-m` (None: a script or not Python)."""
    for i, arg in enumerate(cmdline[1:], start=1):
        if arg == "-m" and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg == "-c" or not arg.startswith("-"):
            return None
    return None


def _exe(cmdline: list[str]) -> str:
    return os.path.basename(cmdline[0]) if cmdline else ""


def is_agent(cmdline: list[str]) -> bool:
    """An areal-console agent (ours or another user's): never part of a job."""
    return len(cmdline) > 2 and cmdline[1] == "-c" and "areal-console" in cmdline[2]


def is_wrapper_exe(cmdline: list[str]) -> bool:
    return _exe(cmdline) in WRAPPER_EXES


def server_kind(cmdline: list[str]) -> tuple[str, int] | None:
    """(kind, default port) of an inference server command line."""
    module = python_module(cmdline)
    if module in SERVER_MODULES:
        return SERVER_MODULES[module]
    if _exe(cmdline) == "vllm" and len(cmdline) > 1 and cmdline[1] == "serve":
        return ("vllm", 8000)
    return None


def detect_role(cmdline: list[str], env: dict[str, str]) -> str | None:
    """A role from the command line: AReaL worker role, inference server, launcher, rank."""
    if is_wrapper_exe(cmdline):
        joined = " ".join(cmdline)
        if RPC_SERVER_MODULE in joined or any(m in joined for m in SERVER_MODULES):
            return "wrapper"  # a shell around a worker or server, not the worker
        return None
    if python_module(cmdline) == RPC_SERVER_MODULE:
        return flag_value(cmdline, "--role") or "rpc_server"
    kind = server_kind(cmdline)
    if kind is not None:
        return kind[0]
    exe = _exe(cmdline)
    if (
        exe == "torchrun"
        or python_module(cmdline) in ("torch.distributed.run", "torch.distributed.launch")
        or (len(cmdline) > 1 and os.path.basename(cmdline[1]) == "torchrun")
    ):
        return "launcher"
    if "RANK" in env:
        return "trainer"
    return None


def env_rank(env: dict[str, str]) -> tuple[int | None, int | None, int | None]:
    """(rank, local rank, world size) from the environment, whichever launcher set it."""
    for rank_var, local_var, size_var in (
        ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", None, "PMI_SIZE"),
    ):
        rank = _to_int(env.get(rank_var))
        if rank is not None:
            local = _to_int(env.get(local_var)) if local_var else None
            return rank, local, _to_int(env.get(size_var))
    return None, _to_int(env.get("LOCAL_RANK")), _to_int(env.get("WORLD_SIZE"))


def rpc_worker(cmdline: list[str]) -> dict[str, Any] | None:
    """What an AReaL rpc_server command line says about its worker (None: not one)."""
    if python_module(cmdline) != RPC_SERVER_MODULE:
        return None
    return {
        "role": flag_value(cmdline, "--role"),
        "worker_index": _to_int(flag_value(cmdline, "--worker-index")),
        "experiment": flag_value(cmdline, "--experiment-name"),
        "trial": flag_value(cmdline, "--trial-name"),
        "fileroot": flag_value(cmdline, "--fileroot"),
    }


def parse_cuda_visible(value: str | None) -> list[int]:
    if not value:
        return []
    out = []
    for part in value.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


class ProcessCollector:
    """Samples /proc. Static facts (cmdline, environ) are cached per (pid, start time)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        # pid -> (start ticks, cmdline, rank env, env error, first seen)
        self._static: dict[int, tuple[int, list[str], dict[str, str], str | None, float]] = {}
        self._last_cpu: dict[int, tuple[int, int, float]] = {}  # pid -> (start, ticks, t)
        self._last_stat: dict[int, tuple[str, str, int, int, int]] = {}  # parse_stat's
        self._boot_time = time.time()

    def _static_info(self, pid: int, start: int) -> tuple[list[str], dict[str, str], str | None]:
        cached = self._static.get(pid)
        now = time.monotonic()
        # A process caught between fork and exec still shows its parent's command line and
        # environment (torchrun's workers do this): re-read young processes until they settle.
        if cached and cached[0] == start and now - cached[4] > YOUNG_SECONDS:
            return cached[1], cached[2], cached[3]
        base = f"{self.proc_root}/{pid}"
        try:
            cmdline = [
                a.decode(errors="replace") for a in _read(base + "/cmdline").split(b"\0") if a
            ]
        except OSError:
            cmdline = []
        env_error = None
        try:
            env = parse_environ(_read(base + "/environ"))
        except PermissionError:
            env, env_error = {}, "permission denied reading environ"
        except OSError:
            env = {}
        first_seen = cached[4] if cached and cached[0] == start else now
        self._static[pid] = (start, cmdline, env, env_error, first_seen)
        return cmdline, env, env_error

    def snapshot(self, watch: set[int] | None = None) -> dict[int, dict[str, Any]]:
        """Every process: pid -> basic facts (no filtering).

        With `watch`, a process seen before that is not in it (and is past its young
        seconds) keeps its last `stat` reading instead of a new one: no CPU%, its state and
        parent as last read. A 1 Hz sample then reads only the processes it reports."""
        now = time.monotonic()
        procs: dict[int, dict[str, Any]] = {}
        seen: set[int] = set()
        last_stat = self._last_stat
        for name in os.listdir(self.proc_root):
            if not name.isdigit():
                continue
            pid = int(name)
            known = last_stat.get(pid)
            if watch is not None and known is not None and pid not in watch:
                cached = self._static.get(pid)
                if cached is not None and now - cached[4] > YOUNG_SECONDS:
                    seen.add(pid)
                    procs[pid] = {
                        "pid": pid,
                        "ppid": known[2],
                        "comm": known[0],
                        "state": known[1],
                        "cmdline": cached[1],
                        "env": cached[2],
                        "env_error": cached[3],
                        "cpu_percent": None,
                    }
                    continue
            try:
                stat = parse_stat(_read_small(f"{self.proc_root}/{pid}/stat"))
            except (OSError, ValueError, IndexError):
                continue
            comm, state, ppid, ticks, start = stat
            last_stat[pid] = stat
            seen.add(pid)
            cmdline, env, env_error = self._static_info(pid, start)
            prev = self._last_cpu.get(pid)
            cpu_percent: float | None = None
            if prev and prev[0] == start and now > prev[2]:
                cpu_percent = round(100.0 * (ticks - prev[1]) / CLK_TCK / (now - prev[2]), 1)
            self._last_cpu[pid] = (start, ticks, now)
            procs[pid] = {
                "pid": pid,
                "ppid": ppid,
                "comm": comm,
                "state": state,
                "cmdline": cmdline,
                "env": env,
                "env_error": env_error,
                "cpu_percent": cpu_percent,
            }
        for gone in set(last_stat) - seen:
            self._static.pop(gone, None)
            self._last_cpu.pop(gone, None)
            last_stat.pop(gone, None)
        return procs

    def rss(self, pid: int) -> int | None:
        try:
            return int(_read_small(f"{self.proc_root}/{pid}/statm").split()[1]) * PAGE_SIZE
        except (OSError, ValueError, IndexError):
            return None


def _server_address(cmdline: list[str], default_port: int) -> dict[str, Any]:
    host = flag_value(cmdline, "--host")
    port = _to_int(flag_value(cmdline, "--port")) or default_port
    # A server bound to every interface answers on loopback, where the agent is.
    target = {None: "127.0.0.1", "": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(
        host, host
    )
    shown = f"[{target}]" if target and ":" in target else target
    return {"host": host, "port": port, "url": f"http://{shown}:{port}{HEALTH_PATH}"}


def identify(p: dict[str, Any]) -> None:
    """Role, rank, job and server address of one process, from its command line and env."""
    cmdline, env = p["cmdline"], p["env"]
    p["role"] = detect_role(cmdline, env)
    rank, local_rank, world_size = env_rank(env)
    if "RANK" not in env and not is_python(cmdline, p["comm"]):
        rank = local_rank = world_size = None  # a shell inside an srun step is no rank
    p.update(rank=rank, local_rank=local_rank, world_size=world_size, job=None)
    p.update(worker_index=None, server=None)
    worker = rpc_worker(cmdline)
    if worker is not None:
        index = worker["worker_index"]
        # AReaL itself lets SLURM_PROCID override --worker-index (guard/app.py:565-571).
        if _to_int(env.get("SLURM_PROCID")) is not None:
            index = _to_int(env.get("SLURM_PROCID"))
        p["worker_index"] = index
        if worker["experiment"] is not None or worker["trial"] is not None:
            p["job"] = f"{worker['experiment']}/{worker['trial']}"
        training = worker["role"] in TRAINING_ROLES
        p.update(rank=index if training else None, local_rank=0 if training else None)
        p["world_size"] = None  # counted over the job's workers below
        return
    kind = server_kind(cmdline)
    if kind is not None:
        p["server"] = {"kind": kind[0], **_server_address(cmdline, kind[1])}


def _link_job_tree(procs: dict[int, dict[str, Any]]) -> None:
    """Wrappers, the controller and servers take the job of the workers they belong to."""
    for p in procs.values():
        if p["job"] is None or p["worker_index"] is None:
            continue
        # Up from a worker: its wrappers (bash, stdbuf), then the controller that started it.
        cur = procs.get(p["ppid"])
        seen = 0
        while cur is not None and seen < 8:
            seen += 1
            if is_wrapper_exe(cur["cmdline"]):
                cur["role"], cur["job"] = "wrapper", p["job"]
            elif cur["worker_index"] is None and is_python(cur["cmdline"], cur["comm"]):
                if cur["role"] is None:
                    cur["role"] = "controller"
                cur["job"] = cur["job"] or p["job"]
                break
            else:
                break
            cur = procs.get(cur["ppid"])
    # Down: tee/sed of a wrapper, servers started by a worker (rollout workers start SGLang).
    children: dict[int, list[dict[str, Any]]] = {}
    for p in procs.values():
        children.setdefault(p["ppid"], []).append(p)
    stack = [p for p in procs.values() if p["job"] is not None]
    while stack:
        parent = stack.pop()
        for child in children.get(parent["pid"], []):
            if child["job"] is not None:
                continue
            if is_wrapper_exe(child["cmdline"]) and parent["role"] == "wrapper":
                child["role"] = "wrapper"
            elif child["server"] is None and child["role"] is None:
                continue
            child["job"] = parent["job"]
            stack.append(child)
    # World size of a training role: its workers in the same experiment/trial.
    counts: dict[tuple[str, str], int] = {}
    for p in procs.values():
        if p["worker_index"] is not None and p["rank"] is not None:
            key = (p["job"] or "", p["role"] or "")
            counts[key] = counts.get(key, 0) + 1
    for p in procs.values():
        if p["worker_index"] is not None and p["rank"] is not None:
            p["world_size"] = counts[(p["job"] or "", p["role"] or "")]


IDENTITY_KEYS = ("role", "rank", "local_rank", "world_size", "job", "worker_index", "server")


def select_processes(
    procs: dict[int, dict[str, Any]],
    include_all: bool,
    cache: dict[int, tuple[Any, Any, dict[str, Any]]] | None = None,
) -> list[int]:
    """Training processes (ranks, known roles, their wrappers and controller); with
    include_all, every Python process too.

    `cache` (pid -> (cmdline, env, identity)) keeps each process's `identify` result while
    its command line and environment are the same objects (the collector re-reads them
    only for a new or young process), so a 1 Hz sample does not parse them again."""
    for pid in [pid for pid, p in procs.items() if is_agent(p["cmdline"])]:
        procs.pop(pid)
    for pid, p in procs.items():
        known = cache.get(pid) if cache is not None else None
        if known is not None and known[0] is p["cmdline"] and known[1] is p["env"]:
            p.update(known[2])
            continue
        identify(p)
        if cache is not None:
            cache[pid] = (p["cmdline"], p["env"], {k: p[k] for k in IDENTITY_KEYS})
    if cache is not None:
        for gone in [pid for pid in cache if pid not in procs]:
            del cache[gone]
    _link_job_tree(procs)
    chosen = []
    for pid, p in procs.items():
        ranked = p["rank"] is not None or any(
            k in p["env"] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
        )
        if ranked or p["role"] is not None or (include_all and is_python(p["cmdline"], p["comm"])):
            chosen.append(pid)
    return sorted(chosen)


def process_record(
    p: dict[str, Any], rss: int | None, gpu_use: dict[int, list[tuple[int, int | None]]]
) -> dict[str, Any]:
    env = p["env"]
    used = gpu_use.get(p["pid"], [])
    if used:
        gpus = sorted({idx for idx, _ in used})
        mems = [m for _, m in used if m is not None]
        gpu_memory: int | None = sum(mems) if mems else None
    else:
        gpus = parse_cuda_visible(env.get("CUDA_VISIBLE_DEVICES"))
        gpu_memory = None
    if "rank" in p:
        rank, local_rank, world_size = p["rank"], p["local_rank"], p["world_size"]
    else:
        rank, local_rank, world_size = env_rank(env)
    return {
        "pid": p["pid"],
        "ppid": p["ppid"],
        "cmdline": " ".join(p["cmdline"]) or f"[{p['comm']}]",
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": _to_int(env.get("MASTER_PORT")),
        "torchelastic_run_id": env.get("TORCHELASTIC_RUN_ID"),
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "role": p.get("role"),
        "job": p.get("job"),
        "worker_index": p.get("worker_index"),
        "server": p.get("server"),
        "cpu_percent": p["cpu_percent"],
        "rss": rss,
        "state": p["state"],
        "gpus": gpus,
        "gpu_memory": gpu_memory,
        "env": dict(env),  # the rank variables only (RANK_VARS), for the process detail
        "env_error": p["env_error"],
    }


class HealthPoller:
    """`GET /health` of inference servers, with a short timeout; answers are reused for
    HEALTH_TTL seconds and refreshed in the background, so a sample never waits on a
    server it has already asked (only a server seen for the first time costs a poll)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self._running: dict[str, threading.Thread] = {}

    @staticmethod
    def poll(url: str, timeout: float = HEALTH_TIMEOUT) -> dict[str, Any]:
        import http.client
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        started = time.monotonic()
        result: dict[str, Any] = {"ok": False, "status": None, "error": None}
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        try:
            conn.request("GET", parts.path or "/")
            response = conn.getresponse()
            response.read(4096)
            result["status"] = response.status
            result["ok"] = response.status == 200
            if not result["ok"]:
                result["error"] = f"HTTP {response.status} {response.reason}".strip()
        except TimeoutError:
            result["error"] = f"no answer within {timeout:g}s"
        except ConnectionRefusedError:
            result["error"] = "connection refused (nothing listens on that port)"
        except (OSError, http.client.HTTPException) as exc:
            result["error"] = str(exc) or type(exc).__name__
        finally:
            conn.close()
        result["latency_ms"] = round(1000 * (time.monotonic() - started), 1)
        result["checked_at"] = time.time()
        return result

    def _refresh(self, url: str) -> None:
        result = self.poll(url)
        with self._lock:
            self._cache[url] = dict(result, _mono=time.monotonic())
            self._running.pop(url, None)

    def health(self, urls: list[str]) -> dict[str, dict[str, Any]]:
        """The latest answer of each URL (first-time URLs are polled now, in parallel)."""
        now = time.monotonic()
        waits = []
        with self._lock:
            for url in set(urls):
                cached = self._cache.get(url)
                if (cached is None or now - cached["_mono"] > HEALTH_TTL) and (
                    url not in self._running
                ):
                    thread = threading.Thread(
                        target=self._refresh, args=(url,), name="health", daemon=True
                    )
                    self._running[url] = thread
                    thread.start()
                if cached is None:
                    waits.append(self._running[url])
        for thread in waits:
            thread.join(HEALTH_TIMEOUT + 1.0)
        with self._lock:
            return {
                url: {k: v for k, v in self._cache[url].items() if k != "_mono"}
                for url in urls
                if url in self._cache
            }


# --------------------------------------------------------------------------------------
# GPUs through NVML (optional)


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


# --------------------------------------------------------------------------------------
# py-spy


def cpu_count() -> int:
    """The cores this process may run on (its affinity, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def find_pyspy() -> str | None:
    """The py-spy to run: the first on PATH, unless that is a version manager's shim
    script (pyenv, asdf: a shell and the manager run before every dump, five times the
    dump's own cost) and the py-spy installed beside this Python is the program itself."""
    import shutil

    found = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(beside, os.X_OK) or os.path.isdir(beside):
        return found
    if found is None or (not _is_executable_binary(found) and _is_executable_binary(beside)):
        return beside
    return found


def _is_executable_binary(path: str) -> bool:
    """An ELF or Mach-O program, not a script."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return False
    return magic == b"\x7fELF" or magic in (b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


def explain_pyspy_failure(pid: int, text: str, returncode: int | None) -> tuple[str, str]:
    """(reason code, actionable message) for a failed py-spy dump."""
    low = text.lower()
    if not os.path.exists(f"/proc/{pid}"):
        return "gone", f"process {pid} exited during capture"
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        return "permission", (
            f"permission denied attaching to {pid}: run as the job's user or root, set "
            "kernel.yama.ptrace_scope=0 (sysctl), or give the container SYS_PTRACE"
        )
    if "failed to find python version" in low or "failed to get python version" in low:
        return "not_python", f"{pid} is not a Python process (a wrapper? pass its Python child)"
    if "no such process" in low or "failed to open process" in low:
        return "gone", f"process {pid} exited during capture"
    first = text.strip().splitlines()[-1] if text.strip() else f"exit code {returncode}"
    return "error", f"py-spy failed on {pid}: {first}"


def _is_wrapper(pid: int) -> bool:
    """A live process that is not Python itself (a shell, a launcher binary)."""
    try:
        raw = _read(f"/proc/{pid}/cmdline").split(b"\0")
        cmdline = [a.decode(errors="replace") for a in raw if a]
        comm = _read(f"/proc/{pid}/comm").decode(errors="replace").strip()
    except OSError:
        return False  # gone: py-spy will say so
    return not is_python(cmdline, comm)


def python_descendants(pid: int, procs: dict[int, dict[str, Any]]) -> list[int]:
    """The nearest Python processes at or below `pid` (walks shells and launchers' children)."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p["ppid"], []).append(p["pid"])
    out: list[int] = []
    stack = [pid]
    while stack:
        cur = stack.pop()
        info = procs.get(cur)
        if info is not None and is_python(info["cmdline"], info["comm"]) and cur != pid:
            out.append(cur)
            continue
        stack.extend(children.get(cur, []))
    return sorted(out)


# --------------------------------------------------------------------------------------
# The agent


class Agent:
    def __init__(self, stdin: Any = None, stdout: Any = None) -> None:
        self.stdin = stdin or sys.stdin.buffer
        self.stdout = stdout or sys.stdout.buffer
        self._write_lock = threading.Lock()
        self.processes = ProcessCollector()
        self.gpus = GpuCollector()
        self.health = HealthPoller()
        self._sample_lock = threading.Lock()
        self._streams: dict[int, threading.Event] = {}
        self._stream_ids = 0
        self.exiting = False  # set when no request can run any more (the interpreter exits)
        self.pool = Workers(16, "areal-agent")
        self.started = time.time()
        self.extensions: dict[str, Any] = {}
        self._primed = False
        self._samples = 0
        self._watch: set[int] | None = None  # pids whose /proc/PID/stat each sample reads
        self._identities: dict[int, tuple[Any, Any, dict[str, Any]]] = {}
        # Under `srun`, one step may carry the agents of many nodes on one stdin (the
        # console broadcasts); a request naming another node is for another agent.
        self.node_name: str | None = os.environ.get("SLURMD_NODENAME") or None

    # output --------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()
        with self._write_lock:
            try:
                self.stdout.write(data)
                self.stdout.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the console went away; EOF on stdin ends us shortly

    def emit(self, event: str, **fields: Any) -> None:
        self.send({"event": event, **fields})

    # dispatch ------------------------------------------------------------------------
    def handle_line(self, line: bytes) -> None:
        text = line.strip()
        if not text:
            return
        try:
            request = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            self.send({"id": None, "ok": False, "error": f"malformed request line: {exc}"})
            return
        if not isinstance(request, dict):
            self.send({"id": None, "ok": False, "error": "malformed request: not a JSON object"})
            return
        target = request.get("node")
        if target is not None and self.node_name is not None:
            mine = target == self.node_name or (
                isinstance(target, list) and self.node_name in target
            )
            if not mine:
                return
        rid = request.get("id")
        name = request.get("op")
        args = request.get("args")
        if args is None:
            args = {}
        if not isinstance(name, str) or name not in OPS:
            known = ", ".join(sorted(OPS))
            self.send({"id": rid, "ok": False, "error": f"unknown op {name!r} (known: {known})"})
            return
        if not isinstance(args, dict):
            self.send({"id": rid, "ok": False, "error": f"bad arguments for {name}: not an object"})
            return
        try:
            self.pool.submit(self._run, rid, name, args)
        except RuntimeError:  # the interpreter is exiting (an agent served by a thread of the
            self.exiting = True  # console, e.g. after Ctrl-C): stop serving, say nothing

    def _run(self, rid: Any, name: str, args: dict[str, Any]) -> None:
        try:
            result = OPS[name](self, args)
        except OpError as exc:
            self.send({"id": rid, "ok": False, "error": str(exc)})
        except (TypeError, ValueError, KeyError) as exc:
            self.send({"id": rid, "ok": False, "error": f"bad arguments for {name}: {exc}"})
        except Exception as exc:  # never crash the agent
            import traceback

            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            self.send({"id": rid, "ok": False, "error": f"{name} failed: {detail}"})
        else:
            self.send({"id": rid, "ok": True, "result": result})

    def serve(self) -> None:
        self.emit(
            "ready",
            protocol=PROTOCOL_VERSION,
            agent_version=AGENT_VERSION,
            pid=os.getpid(),
            node=self.node_name,
        )
        while not self.exiting:
            line = self.stdin.readline()
            if not line:
                break
            self.handle_line(line)
        for stop in self._streams.values():
            stop.set()
        self.pool.shutdown(wait=False, cancel=True)

    # sampling ------------------------------------------------------------------------
    def sample(
        self, include_all: bool = False, cpu: bool = True, gpus: bool = True
    ) -> dict[str, Any]:
        """Processes (and GPUs). `cpu=False` skips the first call's CPU% baseline wait
        (a capture needs no CPU%); `gpus=False` leaves NVML alone."""
        with self._sample_lock:
            if cpu and not self._primed:
                # CPU% needs two readings: take a short baseline on the first sample.
                self.processes.snapshot()
                time.sleep(0.2)
                self._primed = True
            # Between full readings (every FULL_SAMPLE_EVERY samples, a pid reused meanwhile
            # is caught then), only the processes reported last time, their parents and
            # new processes are read again.
            self._samples += 1
            full = include_all or self._watch is None or self._samples % FULL_SAMPLE_EVERY == 0
            procs = self.processes.snapshot(None if full else self._watch)
            gpu_list: list[dict[str, Any]] = []
            gpu_use: dict[int, list[tuple[int, int | None]]] = {}
            gpu_error: str | None = None
            if gpus:
                gpu_list, gpu_use, gpu_error = self.gpus.collect()
            procs.pop(os.getpid(), None)  # the agent itself is not part of any job
            chosen = select_processes(procs, include_all, self._identities)
            self._watch = set(chosen) | {procs[pid]["ppid"] for pid in chosen}
            records = [
                process_record(procs[pid], self.processes.rss(pid), gpu_use) for pid in chosen
            ]
        servers = [r["server"] for r in records if r.get("server")]
        if servers:
            answers = self.health.health([srv["url"] for srv in servers])
            for srv in servers:
                srv["health"] = answers.get(srv["url"])
        return {
            "time": time.time(),
            "hostname": os.uname().nodename,
            "gpus": gpu_list,
            "gpu_error": gpu_error,
            "processes": records,
        }


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([a-z_]+)\}")


def fill_placeholders(text: str, values: dict[str, str]) -> str:
    """Fill `{name}` fields of a launch template in one pass: a value is never searched
    for fields itself (a path containing `{job_dir}` stays as it is). `{{` and `}}` are
    literal braces; unknown fields are kept for a later pass."""

    def one(match: Any) -> str:
        token, name = match.group(0), match.group(1)
        if name is None:
            return token[0]
        return values.get(name, token)

    return _PLACEHOLDER.sub(one, text)


def escape_placeholders(value: str) -> str:
    """`value` as literal text inside a template (braces doubled)."""
    return value.replace("{", "{{").replace("}", "}}")


def _arg(args: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = args.get(name, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise OpError(f"argument {name!r} must be {kind.__name__}, got {value!r}")
    return value


@op("hello")
def op_hello(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    import importlib.util

    def present(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    # Loading NVML can take a second on a GPU node: only when the console asks.
    ok: bool | None = None
    nvml_error: str | None = None
    if _arg(args, "gpus", bool, True):
        ok, nvml_error = agent.gpus.available()
    return {
        "protocol": PROTOCOL_VERSION,
        "agent_version": AGENT_VERSION,
        "hostname": os.uname().nodename,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "pid": os.getpid(),
        "user": _user(),
        "tools": {
            "py-spy": find_pyspy(),
            "pynvml": ok,
            "nvml_error": nvml_error,
            "torch": present("torch"),
        },
        "ops": sorted(OPS),
    }


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


@op("ping")
def op_ping(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    return {"time": time.time()}


@op("sample")
def op_sample(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    return agent.sample(
        _arg(args, "all", bool, False),
        cpu=_arg(args, "cpu", bool, True),
        gpus=_arg(args, "gpus", bool, True),
    )


@op("stream")
def op_stream(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Start a periodic sample stream: `sample` events every `interval` seconds."""
    interval = _arg(args, "interval", float, 1.0)
    include_all = _arg(args, "all", bool, False)
    if not 0.05 <= interval <= 3600:
        raise OpError(f"argument 'interval' must be between 0.05 and 3600 seconds, got {interval}")
    agent._stream_ids += 1
    sid = agent._stream_ids
    stop = threading.Event()
    agent._streams[sid] = stop

    def loop() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            agent.emit("sample", stream=sid, data=agent.sample(include_all))
            next_at += interval
            stop.wait(max(0.0, next_at - time.monotonic()))

    threading.Thread(target=loop, name=f"stream-{sid}", daemon=True).start()
    return {"stream": sid, "interval": interval}


@op("stream_stop")
def op_stream_stop(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    sid = _arg(args, "stream", int, 0)
    stop = agent._streams.pop(sid, None)
    if stop is None:
        raise OpError(f"no stream {sid}")
    stop.set()
    return {"stream": sid, "stopped": True}


@op("pyspy")
def op_pyspy(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """`py-spy dump --json` of each PID, all in parallel, one py-spy per PID."""
    pids = args.get("pids")
    if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
        raise OpError("argument 'pids' must be a list of integers")
    timeout = _arg(args, "timeout", float, 10.0)
    nonblocking = _arg(args, "nonblocking", bool, False)
    native = _arg(args, "native", bool, False)
    with_locals = _arg(args, "locals", bool, False)
    # Echoed in one `pyspy_progress` event per finished dump (for a progress display).
    progress = args.get("progress")
    # py-spy is CPU-bound while it reads a process: more at once than cores only queues.
    parallel = _arg(args, "parallel", int, 0) or cpu_count()
    pyspy = find_pyspy()
    if pyspy is None:
        return {
            "dumps": [
                {
                    "pid": pid,
                    "ok": False,
                    "reason": "missing",
                    "error": "py-spy not found on this node: pip install py-spy",
                }
                for pid in pids
            ]
        }
    targets: list[tuple[int, int]] = []  # (requested pid, dumped pid)
    wrappers = [pid for pid in pids if _is_wrapper(pid)]
    # Only wrappers need the whole process table (to find their Python children).
    procs = agent.processes.snapshot() if wrappers else {}
    for pid in pids:
        if pid in wrappers:
            kids = python_descendants(pid, procs)
            targets.extend((pid, kid) for kid in kids) if kids else targets.append((pid, pid))
        else:
            targets.append((pid, pid))

    def dump(pair: tuple[int, int]) -> dict[str, Any]:
        requested, pid = pair
        cmd = [pyspy, "dump", "--json", "--pid", str(pid)]
        if nonblocking:
            cmd.append("--nonblocking")
        if native:
            cmd.append("--native")
        if with_locals:
            cmd.append("--locals")
        started = time.monotonic()
        record: dict[str, Any] = {"pid": pid, "requested_pid": requested}
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            record.update(
                ok=False, reason="timeout", error=f"py-spy timed out after {timeout:g}s on {pid}"
            )
            return record
        record["seconds"] = round(time.monotonic() - started, 3)
        out = proc.stdout.decode(errors="replace")
        if proc.returncode == 0:
            try:
                record.update(ok=True, threads=json.loads(out))
                return record
            except ValueError:
                pass
        reason, message = explain_pyspy_failure(
            pid, proc.stderr.decode(errors="replace") + out, proc.returncode
        )
        record.update(ok=False, reason=reason, error=message)
        return record

    done = 0
    done_lock = threading.Lock()

    def dump_and_report(pair: tuple[int, int]) -> dict[str, Any]:
        nonlocal done
        record = dump(pair)
        if progress is not None:
            with done_lock:
                done += 1
                count = done
            agent.emit(
                "pyspy_progress",
                token=progress,
                pid=record["pid"],
                ok=record.get("ok", False),
                done=count,
                total=len(targets),
            )
        return record

    dumps = parallel_map(dump_and_report, targets, min(64, parallel))
    return {"dumps": key_stacks(dumps), "pyspy": pyspy}


def key_stacks(dumps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every thread a `key` (a digest of its frames) and send each distinct stack's
    frames once: ranks of a job mostly share their stacks, so a node's reply shrinks to a
    few stacks, and the console interns a stack by one lookup instead of reading frames."""
    try:  # hashlib's own blake2b, without loading OpenSSL for every other digest (3 ms)
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b

    sent: set[str] = set()
    for d in dumps:
        for thread in d.get("threads") or []:
            if "key" in thread:
                continue
            frames = thread.get("frames") or []
            text = json.dumps(frames, separators=(",", ":"), sort_keys=True)
            key = blake2b(text.encode(), digest_size=12).hexdigest()
            thread["key"] = key
            if key in sent:
                del thread["frames"]
            else:
                sent.add(key)
    return dumps


@op("load")
def op_load(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Load an extension module sent by the console; its `OPS` dict adds request handlers.

    The console ships its own code this way (the same trust as the agent itself).
    """
    name = _arg(args, "name", str, "")
    source = _arg(args, "source", str, "")
    if not name.isidentifier():
        raise OpError(f"bad extension name {name!r}")
    namespace: dict[str, Any] = {"__name__": f"areal_node_ext_{name}"}
    exec(compile(source, f"<areal-console extension {name}>", "exec"), namespace)
    ops = namespace.get("OPS", {})
    for op_name, func in ops.items():
        OPS[op_name] = func
    agent.extensions[name] = namespace
    return {"name": name, "ops": sorted(ops)}


@op("shutdown")
def op_shutdown(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    threading.Timer(0.05, lambda: os._exit(0)).start()
    return {"bye": True}


# --------------------------------------------------------------------------------------
# Jobs: detached launches (replays, trainers), their logs and exit codes; dump indexes.
#
# Each job runs under a small wrapper that is the leader of a new session: it starts the
# command in its own process group with output appended to the log, forwards SIGTERM to
# that group, and writes `exit.json` when the command ends. The record therefore survives
# the agent (and the console) going away: a later agent reads the job directory and knows
# whether the job is running, how it ended, or that it vanished without a word ("unknown").

import contextlib  # noqa: E402
import signal as _signal  # noqa: E402

JOB_WRAPPER = (
    "import json,os,signal,subprocess,sys,time\n"
    "d=sys.argv[1];log=sys.argv[2];argv=sys.argv[3:]\n"
    "out=open(log,'ab')\n"
    "stopped=[False]\n"
    "def write(name,data):\n"
    " t=os.path.join(d,name+'.tmp');f=open(t,'w');json.dump(data,f);f.close()"
    ";os.replace(t,os.path.join(d,name))\n"
    "try:\n"
    " p=subprocess.Popen(argv,stdin=subprocess.DEVNULL,stdout=out,stderr=subprocess.STDOUT,"
    "preexec_fn=os.setpgrp)\n"
    "except OSError as e:\n"
    " out.write(('cannot start %s: %s\\n'%(argv[0],e.strerror)).encode());out.close()\n"
    " write('exit.json',{'exit_code':127,'ended':time.time(),'stopped':False,"
    "'error':'cannot start %s: %s'%(argv[0],e.strerror)});sys.exit(127)\n"
    "write('child.json',{'pid':p.pid})\n"
    "def term(sig,frame):\n"
    " stopped[0]=True\n"
    " try:os.killpg(p.pid,sig)\n"
    " except OSError:pass\n"
    "signal.signal(signal.SIGTERM,term);signal.signal(signal.SIGINT,term)\n"
    "code=p.wait()\n"
    "write('exit.json',{'exit_code':code,'ended':time.time(),'stopped':stopped[0]})\n"
)

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def node_cache_dir() -> str:
    """This node's cache: `$XDG_CACHE_HOME/areal-console` or `~/.cache/areal-console`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "areal-console")


def jobs_root(args: dict[str, Any]) -> str:
    root = args.get("jobs_dir") or os.path.join(node_cache_dir(), "jobs")
    if not isinstance(root, str):
        raise OpError("argument 'jobs_dir' must be a string")
    return os.path.expanduser(root)


def _job_dir(args: dict[str, Any]) -> tuple[str, str]:
    job_id = _arg(args, "job", str, "")
    if not JOB_ID.match(job_id):
        raise OpError(f"bad job id {job_id!r}")
    path = os.path.join(jobs_root(args), job_id)
    if not os.path.isfile(os.path.join(path, "job.json")):
        raise OpError(f"no job {job_id} on this node")
    return job_id, path


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _start_ticks(pid: int) -> int | None:
    try:
        return parse_stat(_read(f"/proc/{pid}/stat"))[4]
    except (OSError, ValueError, IndexError):
        return None


def job_status(path: str) -> dict[str, Any]:
    """One job's record with its state: running | finished | failed | stopped | unknown."""
    record = _read_json(os.path.join(path, "job.json")) or {}
    ended = _read_json(os.path.join(path, "exit.json"))
    child = _read_json(os.path.join(path, "child.json")) or {}
    record["child_pid"] = child.get("pid")
    if ended is not None:
        code = ended.get("exit_code")
        record.update(exit_code=code, ended=ended.get("ended"), error=ended.get("error"))
        if ended.get("stopped"):
            record["state"] = "stopped"
        else:
            record["state"] = "finished" if code == 0 else "failed"
        return record
    pid = record.get("pid")
    alive = isinstance(pid, int) and _start_ticks(pid) == record.get("start_ticks")
    if alive:
        try:  # our own child that exited but was not reaped yet is not running
            alive = parse_stat(_read(f"/proc/{pid}/stat"))[1] != "Z"
        except (OSError, ValueError, IndexError):
            alive = False
    record.update(exit_code=None, state="running" if alive else "unknown")
    if not alive:
        record["error"] = "the job's supervisor ended without recording an exit code"
    return record


def _watch_job(agent: Agent, proc: subprocess.Popen, path: str, job_id: str) -> None:
    proc.wait()
    status = job_status(path)
    agent.emit("job_exit", job=job_id, state=status.get("state"), exit_code=status.get("exit_code"))


@op("job_launch")
def op_job_launch(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Start `argv` detached (new session), output to a log; `{job_dir}` in argv/log is expanded."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise OpError("argument 'argv' must be a non-empty list of strings")
    env_extra = args.get("env") or {}
    if not isinstance(env_extra, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_extra.items()
    ):
        raise OpError("argument 'env' must map names to strings")
    job_id = _arg(args, "job", str, "")
    job_id = job_id or time.strftime("job-%Y%m%d-%H%M%S-") + os.urandom(3).hex()
    if not JOB_ID.match(job_id):
        raise OpError(f"bad job id {job_id!r}")
    root = jobs_root(args)
    path = os.path.join(root, job_id)
    try:
        os.makedirs(path, exist_ok=False)
    except FileExistsError:
        raise OpError(f"job {job_id} already exists on this node") from None
    except OSError as exc:
        raise OpError(f"cannot create job directory {path}: {exc.strerror}") from None
    # argv and log are templates: `{job_dir}` is filled here, `{{`/`}}` are literal braces.
    argv = [fill_placeholders(a, {"job_dir": path}) for a in argv]
    log = _arg(args, "log", str, "") or "{job_dir}/output.log"
    log = fill_placeholders(os.path.expanduser(log), {"job_dir": path})
    cwd = os.path.expanduser(_arg(args, "cwd", str, "") or path)
    if not os.path.isdir(cwd):
        raise OpError(f"working directory {cwd} does not exist on this node")
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    env = dict(os.environ)
    env.update(env_extra)
    python = sys.executable or "python3"
    record = {
        "job": job_id,
        "name": _arg(args, "name", str, "") or os.path.basename(argv[0]),
        "argv": argv,
        "env": env_extra,
        "cwd": cwd,
        "log": log,
        "dir": path,
        "meta": args.get("meta") if isinstance(args.get("meta"), dict) else {},
        "started": time.time(),
        "host": os.uname().nodename,
    }
    _write_json(os.path.join(path, "job.json"), record)
    proc = subprocess.Popen(
        [python, "-c", JOB_WRAPPER, path, log, *argv],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives the agent and the console's SSH session
    )
    record.update(pid=proc.pid, start_ticks=_start_ticks(proc.pid))
    _write_json(os.path.join(path, "job.json"), record)
    threading.Thread(target=_watch_job, args=(agent, proc, path, job_id), daemon=True).start()
    return job_status(path)


@op("jobs")
def op_jobs(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Every job recorded on this node (newest first), or those named in `jobs`."""
    root = jobs_root(args)
    wanted = args.get("jobs")
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    out = []
    for name in names:
        if wanted is not None and name not in wanted:
            continue
        path = os.path.join(root, name)
        if JOB_ID.match(name) and os.path.isfile(os.path.join(path, "job.json")):
            out.append(job_status(path))
    out.sort(key=lambda r: r.get("started") or 0, reverse=True)
    return {"jobs": out}


@op("job_stop")
def op_job_stop(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """SIGTERM the job's process group; SIGKILL it after `grace` seconds."""
    _, path = _job_dir(args)
    grace = _arg(args, "grace", float, 10.0)
    status = job_status(path)
    if status["state"] != "running":
        return status
    with contextlib.suppress(ProcessLookupError):
        os.kill(status["pid"], _signal.SIGTERM)  # the wrapper forwards it to the job's group
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(path, "exit.json")):
            return job_status(path)
        time.sleep(0.05)
    for pid in (status.get("child_pid"), status["pid"]):
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.killpg(pid, _signal.SIGKILL)
    if not os.path.exists(os.path.join(path, "exit.json")):
        _write_json(
            os.path.join(path, "exit.json"),
            {"exit_code": -9, "ended": time.time(), "stopped": True},
        )
    return job_status(path)


def tail_lines(path: str, lines: int, max_bytes: int = 1 << 20) -> list[str]:
    """The last `lines` lines of a file, reading at most `max_bytes` from its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    text = data.decode(errors="replace").splitlines()
    return text[-lines:] if lines > 0 else []


@op("job_tail")
def op_job_tail(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    job_id, path = _job_dir(args)
    lines = _arg(args, "lines", int, 50)
    status = job_status(path)
    return {
        "job": job_id,
        "state": status["state"],
        "exit_code": status.get("exit_code"),
        "log": status.get("log"),
        "lines": tail_lines(status.get("log") or "", lines),
    }


@op("file_read")
def op_file_read(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """A text file (metrics JSONL and the like), at most `max_bytes` from its start."""
    path = os.path.expanduser(_arg(args, "path", str, ""))
    limit = _arg(args, "max_bytes", int, 4 << 20)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise OpError(f"no such file on this node: {path}") from None
    except OSError as exc:
        raise OpError(f"cannot read {path}: {exc.strerror}") from None
    return {
        "path": path,
        "text": data[:limit].decode(errors="replace"),
        "truncated": len(data) > limit,
    }


@op("stage_file")
def op_stage_file(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """A file cached by content hash (e.g. the reference trainer); send `source` on a miss."""
    import hashlib

    name = _arg(args, "name", str, "")
    digest = _arg(args, "sha256", str, "")
    if not re.match(r"^[A-Za-z0-9_.-]+$", name) or not re.match(r"^[0-9a-f]{64}$", digest):
        raise OpError("arguments 'name' and 'sha256' must be a plain file name and a hex digest")
    path = os.path.join(node_cache_dir(), "files", digest, name)
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() == digest:
                return {"path": path, "present": True}
    source = args.get("source")
    if source is None:
        return {"path": path, "present": False}
    if not isinstance(source, str):
        raise OpError("argument 'source' must be a string")
    data = source.encode()
    if hashlib.sha256(data).hexdigest() != digest:
        raise OpError(f"content of {name} does not match its sha256")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return {"path": path, "present": True, "written": True}


# AReaL's dump names, `step_{step:06d}.pt` / `step_{step:06d}_dp_{dp_rank}.pt`. The one
# definition: the console imports it (core/batches.py, also given to that module when it is
# shipped to a node). The reference trainer, a script run on nodes on its own, keeps a copy
# that tests/test_replay_core.py holds equal to this one.
DUMP_FILE = re.compile(r"^step_(\d{6,})(?:_dp_(\d+))?\.pt$")


@op("replay_index")
def op_replay_index(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """What a trajectory dump directory holds: steps and their dp ranks, checkpoints, metadata."""
    path = os.path.abspath(os.path.expanduser(_arg(args, "path", str, "")))
    if os.path.isfile(path) and DUMP_FILE.match(os.path.basename(path)):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise OpError(f"no dump directory at {path} on this node")
    steps: dict[int, list[int | None]] = {}
    for name in os.listdir(path):
        m = DUMP_FILE.match(name)
        if m:
            rank = int(m.group(2)) if m.group(2) is not None else None
            steps.setdefault(int(m.group(1)), []).append(rank)
    for ranks in steps.values():
        ranks.sort(key=lambda r: -1 if r is None else r)
    try:
        ckpts = sorted(
            int(n[5:-3])
            for n in os.listdir(os.path.join(path, "checkpoints"))
            if re.match(r"^ckpt_\d+\.pt$", n)
        )
    except OSError:
        ckpts = []
    meta = _read_json(os.path.join(path, "trajectory_meta.json"))
    return {
        "dir": path,
        "steps": {str(k): v for k, v in sorted(steps.items())},
        "checkpoints": ckpts,
        "metrics": os.path.isfile(os.path.join(path, "metrics.jsonl")),
        "meta": {
            k: meta.get(k)
            for k in ("trainer", "trainer_version", "world_size", "device", "device_name")
        }
        if meta
        else {},
    }


# --------------------------------------------------------------------------------------
# Flight Recorder traces (the collective ledger): live from a rank's worker server, or
# from the dump files torch (NCCL on timeout) or our launch hook (gloo on a fatal error)
# wrote. Dumps are pickles: decoded with an unpickler that builds only plain containers.

FR_ENV = (
    "RANK",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "AREAL_FR_SOCKET_DIR",
    "TMPDIR",
    "TORCH_WORKER_SERVER_SOCKET",
)
FR_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
FR_MAX_BYTES = 256 << 20


def safe_unpickle(data: bytes) -> Any:
    """Decode a pickle that may hold only None, bools, numbers, strings and containers."""
    import io
    import pickle

    class PlainUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a trace dump")

        def persistent_load(self, pid: Any) -> Any:
            raise pickle.UnpicklingError("refusing persistent ids in a trace dump")

    return PlainUnpickler(io.BytesIO(data)).load()


def slim_trace(data: Any) -> dict[str, Any]:
    """A Flight Recorder dump reduced to what the ledger reads, per process group, as
    columns: the collectives' sequence ids (a range when they run without gaps) and, per
    collective, an index into a small table of what ranks must agree on (op, input and
    output sizes and dtypes). Thousands of entries become two short integer lists, so a
    large job's traces travel and compare cheaply. Point-to-point calls are left out."""
    if not isinstance(data, dict):
        raise ValueError("not a Flight Recorder dump (not a mapping)")
    if "entries" not in data and "pg_status" not in data:
        raise ValueError("not a Flight Recorder dump (no entries, no pg_status)")
    groups: dict[str, dict[str, Any]] = {}
    tables: dict[str, dict[str, int]] = {}
    for e in data.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group") or ("", "")
        name = str(pg[0])
        group = groups.get(name)
        if group is None:
            desc = str(pg[1]) if len(pg) > 1 else ""
            group = groups[name] = {
                "name": name, "desc": desc, "pg_id": e.get("pg_id"),
                "rows": [], "table": [],
            }  # fmt: skip
            tables[name] = {}
        sig = [
            str(e.get("profiling_name") or "?"),
            e.get("input_sizes") or [],
            e.get("output_sizes") or [],
            e.get("input_dtypes") or [],
        ]
        text = json.dumps(sig)
        index = tables[name].get(text)
        if index is None:
            index = tables[name][text] = len(group["table"])
            group["table"].append(sig)
        group["rows"].append((int(e.get("collective_seq_id") or 0), index, e))
    out = []
    for group in groups.values():
        rows = sorted(group.pop("rows"), key=lambda r: r[0])
        seqs = [r[0] for r in rows]
        if seqs and seqs[-1] - seqs[0] == len(seqs) - 1:
            group["seq_range"] = [seqs[0], len(seqs)]
        else:
            group["seqs"] = seqs
        group["keys"] = [r[1] for r in rows]
        last = rows[-1][2] if rows else {}
        group["last_state"] = str(last.get("state") or "")
        group["last_retired"] = bool(last.get("retired"))
        out.append(group)
    return {
        "version": data.get("version"),
        "pg_config": data.get("pg_config") or {},
        "pg_status": data.get("pg_status") or {},
        "groups": out,
    }


def _unix_post(path: str, url: str, timeout: float) -> tuple[int, bytes]:
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(path)
            self.sock = sock

    conn = UnixConnection("localhost", timeout=timeout)
    try:
        conn.request("POST", url, body=b"", headers={"Content-Length": "0"})
        reply = conn.getresponse()
        body = reply.read(FR_MAX_BYTES + 1)
        if len(body) > FR_MAX_BYTES:
            raise ValueError(f"reply larger than {FR_MAX_BYTES} bytes: not a trace")
        return reply.status, body
    finally:
        conn.close()


def fr_sockets(pid: int, env: dict[str, str]) -> list[str]:
    """The sockets a rank's trace can be asked at (our launch hook's, or torch's
    `worker_main`) that exist now."""
    dirs = (env.get("AREAL_FR_SOCKET_DIR"), env.get("TMPDIR"), "/tmp")
    sockets = list(dict.fromkeys(os.path.join(d, f"areal-fr-{pid}.sock") for d in dirs if d))
    if env.get("TORCH_WORKER_SERVER_SOCKET"):
        sockets.append(env["TORCH_WORKER_SERVER_SOCKET"])
    return [path for path in sockets if os.path.exists(path)]


def fr_live(
    pid: int, env: dict[str, str], timeout: float, sockets: list[str] | None = None
) -> dict[str, Any]:
    """Ask a rank's worker server for its trace (at `sockets`, by default all it has)."""
    errors = []
    for path in fr_sockets(pid, env) if sockets is None else sockets:
        for handler in ("areal_fr_trace", "fr_trace_json"):
            try:
                status, body = _unix_post(path, f"/handler/{handler}", timeout)
            except (OSError, ValueError) as exc:
                errors.append(f"{path}: {exc}")
                break
            if status == 200:
                try:
                    return {"ok": True, "socket": path, "trace": slim_trace(json.loads(body))}
                except ValueError as exc:
                    errors.append(f"{path} {handler}: {exc}")
            else:
                errors.append(f"{path} {handler}: HTTP {status}")
    if not errors:
        return {"ok": False, "error": "no Flight Recorder socket (recorder access not enabled)"}
    return {"ok": False, "error": "; ".join(errors)}


def fr_dump_files(prefixes: list[str], since: float | None) -> list[dict[str, Any]]:
    """Every `<prefix><rank>` file under the given prefixes, decoded safely."""
    found = []
    seen = set()
    for prefix in prefixes:
        directory, stem = os.path.split(prefix)
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            tail = name[len(stem) :]
            if not name.startswith(stem) or not tail.isdigit():
                continue
            path = os.path.join(directory, name)
            if path in seen:
                continue
            seen.add(path)
            record: dict[str, Any] = {"path": path, "rank": int(tail)}
            try:
                st = os.stat(path)
                record["mtime"] = st.st_mtime
                if since is not None and st.st_mtime < since:
                    record.update(ok=False, stale=True, error="older than the job's processes")
                elif st.st_size > FR_MAX_BYTES:
                    record.update(ok=False, error=f"{st.st_size} bytes: too large for a trace")
                else:
                    with open(path, "rb") as fh:
                        record.update(ok=True, trace=slim_trace(safe_unpickle(fh.read())))
            except Exception as exc:  # one bad file must not hide the others
                record.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            found.append(record)
    return found


def _boot_time() -> float:
    for line in _read("/proc/stat").decode().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


@op("fr_traces")
def op_fr_traces(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Flight Recorder traces of the given rank PIDs (live) and of dump files on this node."""
    pids = args.get("pids")
    if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
        raise OpError("argument 'pids' must be a list of integers")
    extra = args.get("prefixes") or []
    if not isinstance(extra, list) or not all(isinstance(p, str) for p in extra):
        raise OpError("argument 'prefixes' must be a list of strings")
    timeout = _arg(args, "timeout", float, 5.0)
    live = _arg(args, "live", bool, True)
    envs: dict[int, dict[str, str]] = {}
    starts = []
    for pid in pids:
        try:
            envs[pid] = parse_environ(_read(f"/proc/{pid}/environ"), FR_ENV)
        except OSError:
            envs[pid] = {}
        ticks = _start_ticks(pid)
        if ticks is not None:
            starts.append(ticks)
    prefixes = list(extra)
    for env in envs.values():
        for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
            if env.get(name):
                prefixes.append(env[name])
                break
        else:
            prefixes.append(FR_DEFAULT_PREFIX)
    if not prefixes:
        prefixes.append(FR_DEFAULT_PREFIX)
    since = _boot_time() + min(starts) / CLK_TCK if starts else None
    ranks = []
    if live:
        # Only ranks with a socket are asked, each in a thread of its own (a rank that is
        # slow to answer must not hold up the others); the rest answer at once.
        sockets = {pid: fr_sockets(pid, envs[pid]) for pid in pids}
        asked = [pid for pid in pids if sockets[pid]]
        replies = parallel_map(lambda p: fr_live(p, envs[p], timeout, sockets[p]), asked, 32)
        answers = dict(zip(asked, replies))  # noqa: B905 (no strict= on Python 3.9)
        for pid in pids:
            reply = answers[pid] if pid in answers else fr_live(pid, envs[pid], timeout, [])
            ranks.append({"pid": pid, "rank": _to_int(envs[pid].get("RANK")), **reply})
    return {
        "live": ranks,
        "files": fr_dump_files(list(dict.fromkeys(prefixes)), since),
        "prefixes": list(dict.fromkeys(prefixes)),
    }


# --------------------------------------------------------------------------------------
# Following a training log (AReaL's main.log / trainer.log) and finding a run's log files

TAIL_MAX_BYTES = 4 << 20
LOG_NAMES = ("main.log", "trainer.log", "merged.log")  # preferred first
EVENT_PREFIX = "events.out.tfevents."


def read_chunk(path: str, offset: int, ident: str | None, max_bytes: int) -> dict[str, Any]:
    """Bytes of `path` from `offset`, at most `max_bytes`; never the whole file again.

    `ident` ("dev:inode" from the previous call) detects rotation: a different file under
    the same name is read from its start, as is a file that shrank (truncated). The caller
    keeps `ident` and `next` for its next call.
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        return {"exists": False, "now": time.time()}
    with fh:
        st = os.fstat(fh.fileno())
        current = f"{st.st_dev}:{st.st_ino}"
        rotated = ident is not None and ident != current
        truncated = not rotated and st.st_size < offset
        if rotated or truncated or offset < 0:
            offset = 0
        fh.seek(offset)
        data = fh.read(max(0, min(max_bytes, st.st_size - offset)))
    return {
        "exists": True,
        "ident": current,
        "offset": offset,
        "next": offset + len(data),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "rotated": rotated,
        "truncated": truncated,
        "eof": offset + len(data) >= st.st_size,
        "now": time.time(),
        "utc_offset": int(time.localtime().tm_gmtoff),
        "data": data,
    }


@op("file_tail")
def op_file_tail(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Follow a file: the bytes after `offset` (zlib + base64 in `data`), bounded by `max_bytes`."""
    import base64
    import zlib

    path = os.path.expanduser(_arg(args, "path", str, ""))
    ident = args.get("ident")
    if ident is not None and not isinstance(ident, str):
        raise OpError("argument 'ident' must be a string or null")
    limit = max(1, min(_arg(args, "max_bytes", int, TAIL_MAX_BYTES), 64 << 20))
    try:
        result = read_chunk(path, _arg(args, "offset", int, 0), ident, limit)
    except IsADirectoryError:
        raise OpError(f"{path} is a directory on this node, not a log file") from None
    except OSError as exc:
        raise OpError(f"cannot read {path}: {exc.strerror}") from None
    if not result["exists"]:
        raise OpError(f"no such file on this node: {path}")
    result["data"] = base64.b64encode(zlib.compress(result["data"], 1)).decode()
    result["path"] = path
    return result


def find_logs(path: str, max_depth: int = 3, limit: int = 64) -> dict[str, Any]:
    """A run's log files and tensorboard event files at `path` (a file or a directory)."""
    path = os.path.normpath(os.path.expanduser(path))
    if os.path.isfile(path):
        is_events = os.path.basename(path).startswith(EVENT_PREFIX)
        return {"path": path, "kind": "file", "logs": [] if is_events else [path],
                "events": [path] if is_events else []}  # fmt: skip
    if not os.path.isdir(path):
        raise OpError(f"no such file or directory on this node: {path}")
    logs: list[str] = []
    events: list[str] = []
    base_depth = path.rstrip(os.sep).count(os.sep)
    for root, dirs, files in os.walk(path):
        if root.count(os.sep) - base_depth >= max_depth:
            dirs[:] = []
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if name.startswith(EVENT_PREFIX) and len(events) < limit:
                events.append(full)
            elif root == path and name.endswith(".log"):
                logs.append(full)
    rank = {name: i for i, name in enumerate(LOG_NAMES)}
    logs.sort(key=lambda p: (rank.get(os.path.basename(p), len(LOG_NAMES)), p))
    return {"path": path, "kind": "dir", "logs": logs, "events": events}


@op("log_find")
def op_log_find(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Where a run logs: `main.log`, `trainer.log`, `merged.log`, other `*.log`, event files."""
    return find_logs(_arg(args, "path", str, ""))


def main() -> None:
    agent = Agent()
    agent.serve()
    agent.pool.shutdown(wait=True)  # the requests still running answer before the exit


if __name__ == "__main__" or __name__ == "__areal_node__":
    main()
