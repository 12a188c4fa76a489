"""Processes and ranks: each process's role, rank, job and server, and the records sent.

A process is named from its command line and the rank variables of its environment
(torchrun, Slurm, MPI, AReaL's single-controller workers); the wrappers, controller and
servers around a job's workers take that job.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from areal_node.agent.cmdline import (
    exe_name,
    flag_value,
    flag_values,
    is_agent,
    is_python,
    is_wrapper_exe,
    python_module,
)
from areal_node.agent.procfs import CMDLINE_SEND_MAX, cap_text, to_int
from areal_node.agent.servers import SERVER_MODULES, server_address, server_kind
from areal_node.constants import TRAINING_ROLES

# AReaL single-controller workers (`python3 -m areal.infra.rpc.rpc_server --role R
# --worker-index N ...`, areal/infra/scheduler/local.py:777-814 at AReaL cbff54d6). RANK,
# WORLD_SIZE and MASTER_* reach them later over HTTP (`POST /set_env`), never in their
# /proc environment; the controller sets RANK = the worker's index in its role
# (areal/infra/controller/train_controller.py:336-343).
RPC_SERVER_MODULE = "areal.infra.rpc.rpc_server"
# A Ray Train worker: an actor whose process Ray titles `ray::RayTrainWorker[.method]`
# (ray/train/v2/_internal/execution/worker_group/worker.py, Ray 2.60). Ray Train sets its
# rank variables inside the running process (`_set_torch_distributed_env_vars`,
# ray/train/torch/config.py), never in its /proc environment: its rank is unknown here
# (the console takes it from Ray Train's own state where Ray has it).
RAY_TRAIN_TITLE = "ray::RayTrainWorker"


def detect_role(cmdline: list[str], env: dict[str, str]) -> str | None:
    """A role from the command line: AReaL worker role, inference server, launcher, rank."""
    if is_wrapper_exe(cmdline):
        joined = " ".join(cmdline)
        if RPC_SERVER_MODULE in joined or any(m in joined for m in SERVER_MODULES):
            return "wrapper"  # a shell around a worker or server, not the worker
        return None
    if python_module(cmdline) == RPC_SERVER_MODULE:
        return flag_value(cmdline, "--role") or "rpc_server"
    if cmdline and cmdline[0].split(".")[0] == RAY_TRAIN_TITLE:
        return "ray_train"
    kind = server_kind(cmdline)
    if kind is not None:
        return kind[0]
    exe = exe_name(cmdline)
    if (
        exe == "torchrun"
        or python_module(cmdline) in ("torch.distributed.run", "torch.distributed.launch")
        or (len(cmdline) > 1 and os.path.basename(cmdline[1]) == "torchrun")
    ):
        return "launcher"
    if "RANK" in env:
        return "trainer"
    return None


# Where a rank comes from, the most specific source first: RANK (torchrun and the like set
# it for each worker) over Slurm's task id over the MPI variables.
RANK_SOURCES: tuple[tuple[str, str | None, str], ...] = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", None, "PMI_SIZE"),
)
# Roles that are never a rank, whatever their environment says: a launcher (torchrun under
# srun carries SLURM_PROCID), the shells around a worker, a single-controller's controller.
NOT_RANKS = frozenset({"launcher", "wrapper", "controller"})


def rank_source(env: dict[str, str]) -> tuple[str, int] | None:
    """(variable, value) of the most specific rank variable set, or None."""
    for rank_var, _, _ in RANK_SOURCES:
        rank = to_int(env.get(rank_var))
        if rank is not None:
            return rank_var, rank
    return None


def env_rank(env: dict[str, str]) -> tuple[int | None, int | None, int | None]:
    """(rank, local rank, world size) from the environment, whichever launcher set it."""
    for rank_var, local_var, size_var in RANK_SOURCES:
        rank = to_int(env.get(rank_var))
        if rank is not None:
            local = to_int(env.get(local_var)) if local_var else None
            return rank, local, to_int(env.get(size_var))
    return None, to_int(env.get("LOCAL_RANK")), to_int(env.get("WORLD_SIZE"))


def rpc_worker(cmdline: list[str]) -> dict[str, Any] | None:
    """What an AReaL rpc_server command line says about its worker (None: not one)."""
    if python_module(cmdline) != RPC_SERVER_MODULE:
        return None
    flags = flag_values(cmdline)
    return {
        "role": flags.get("--role"),
        "worker_index": to_int(flags.get("--worker-index")),
        "experiment": flags.get("--experiment-name"),
        "trial": flags.get("--trial-name"),
        "fileroot": flags.get("--fileroot"),
    }


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
        if to_int(env.get("SLURM_PROCID")) is not None:
            index = to_int(env.get("SLURM_PROCID"))
        p["worker_index"] = index
        if worker["experiment"] is not None or worker["trial"] is not None:
            p["job"] = f"{worker['experiment']}/{worker['trial']}"
        training = worker["role"] in TRAINING_ROLES
        p.update(rank=index if training else None, local_rank=0 if training else None)
        p["world_size"] = None  # counted over the job's workers below
        return
    kind = server_kind(cmdline)
    if kind is not None:
        p["server"] = {"kind": kind[0], **server_address(cmdline, kind[1])}


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
            if child["rank"] is not None and child["worker_index"] is None:
                continue  # a rank of its own job (say, torchrun's), not this job's
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


def _drop_inherited_ranks(procs: dict[int, dict[str, Any]]) -> None:
    """A rank variable describes the process it was set for, not every process that
    inherits it: a launcher, wrapper or controller has no rank, and a process whose
    nearest Python ancestor (past the shells) carries the same rank from the same
    variable is that rank's child (a torchrun under srun, a data loader worker, a server
    a rank started), not a rank. AReaL's workers take their index from their own flags."""
    for p in procs.values():
        if p["rank"] is None or p["worker_index"] is not None:
            continue
        if p["role"] in NOT_RANKS:
            p.update(rank=None, local_rank=None, world_size=None)
            continue
        source = rank_source(p["env"])
        cur = procs.get(p["ppid"])
        for _ in range(16):
            if cur is None or rank_source(cur["env"]) != source:
                break
            if is_wrapper_exe(cur["cmdline"]) or cur["role"] == "wrapper":
                cur = procs.get(cur["ppid"])
                continue
            if is_python(cur["cmdline"], cur["comm"]) and cur["role"] != "launcher":
                p.update(rank=None, local_rank=None, world_size=None)
            break


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
    _drop_inherited_ranks(procs)
    chosen = []
    for pid, p in procs.items():
        ranked = p["rank"] is not None or any(
            k in p["env"] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
        )
        if ranked or p["role"] is not None or (include_all and is_python(p["cmdline"], p["comm"])):
            chosen.append(pid)
    return sorted(chosen)


@functools.lru_cache(maxsize=256)
def user_name(uid: int | None) -> str | None:
    """The name of `uid` on this node (its number when it has none)."""
    if uid is None:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def parse_cuda_visible(value: str | None) -> list[int]:
    if not value:
        return []
    out = []
    for part in value.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def process_record(
    p: dict[str, Any],
    rss: int | None,
    gpu_use: dict[int, list[tuple[int, int | None]]],
    stdout: str | None = None,
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
        "user": user_name(p.get("uid")),
        "cmdline": cap_text(
            " ".join(p["cmdline"]) or f"[{p['comm']}]", CMDLINE_SEND_MAX, p.get("cmdline_more", 0)
        ),
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": to_int(env.get("MASTER_PORT")),
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
        "stdout": stdout,  # the file its output goes to (ProcessCollector.stdout_file)
    }
