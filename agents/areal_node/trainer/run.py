"""The run: train, dump or replay, log; and the hangs the demo shows on purpose."""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from areal_node.constants import (
    CHECKPOINT_DIR,
    META_FILE,
    METRIC_NAMES,
    METRICS_FILE,
)
from areal_node.fr_hook import sitecustomize as fr_hook
from areal_node.trainer.areal_log import (
    _g,
    areal_log_line,
    areal_stats,
    log_areal_step,
    tensorboard_writer,
    write_jsonl,
)
from areal_node.trainer.config import TRAINER_NAME, TRAINER_VERSION
from areal_node.trainer.layout import checkpoint_path, dump_path, rotate_dumps
from areal_node.trainer.model import BOS, EOS, Adam, TinyCausalLM
from areal_node.trainer.rollout import generate_groups
from areal_node.trainer.step import train_step


def atomic_save(obj: Any, path: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def output_dir(config: dict[str, Any], default_output_dir: str) -> str:
    """Where the per-step metrics go: `output_dir`, else the dump's `replay` folder when
    replaying, else `default_output_dir`."""
    td = config["trajectory_debug"]
    if config["output_dir"]:
        return str(config["output_dir"])
    return (
        os.path.join(str(td["path"]), "replay") if td["replay_rollout_data"] else default_output_dir
    )


def run(config: dict[str, Any], default_output_dir: str = "reference-trainer-out") -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(config["threads"])
    if torch.cuda.is_available():
        # On CPU every op used here is deterministic already; this switch also imports
        # torch's compiler stack (seconds), so it is only worth it on GPUs.
        torch.use_deterministic_algorithms(True, warn_only=True)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    hang = config["debug"]["hang"]
    if world_size > 1 and backend == "gloo" and config["debug"]["flight_recorder"]:
        enable_flight_recorder()
    if world_size > 1:
        # A hung demo job should stay hung while someone looks at it, not time out.
        timeout = HANG_TIMEOUT if hang != "none" else timedelta(minutes=30)
        dist.init_process_group(backend, timeout=timeout)

    td = config["trajectory_debug"]
    dump_dir = str(td["path"])
    dumping, replaying = bool(td["dump_rollout_data"]), bool(td["replay_rollout_data"])
    out_dir = output_dir(config, default_output_dir)
    dp_suffix = rank if world_size > 1 else None
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        open(os.path.join(out_dir, METRICS_FILE), "w").close()
        print(f"metrics: {os.path.abspath(os.path.join(out_dir, METRICS_FILE))}", flush=True)
        if dumping:
            os.makedirs(os.path.join(dump_dir, CHECKPOINT_DIR), exist_ok=True)
            open(os.path.join(dump_dir, METRICS_FILE), "w").close()
            # Like a model directory: tells readers (the batch browser) the EOS token id.
            with open(os.path.join(dump_dir, "generation_config.json"), "w") as fh:
                json.dump({"eos_token_id": EOS, "bos_token_id": BOS}, fh)
            with open(os.path.join(dump_dir, META_FILE), "w", encoding="utf-8") as fh:
                json.dump(
                    {
                        "trainer": TRAINER_NAME,
                        "trainer_version": TRAINER_VERSION,
                        "world_size": world_size,
                        # What a replay on another device compares against (CUDA and CPU
                        # kernels round differently: not bit for bit across devices).
                        "device": device.type,
                        "device_name": (
                            torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
                        ),
                        "config": config,
                        "metric_names": list(METRIC_NAMES),
                    },
                    fh,
                    indent=1,
                )
    if world_size > 1:
        dist.barrier()

    torch.manual_seed(config["seed"])
    m = config["model"]
    model = TinyCausalLM(m["d_model"], m["n_layers"], m["n_heads"]).to(device)
    optimizer = Adam(list(model.parameters()), lr=float(config["actor"]["optimizer"]["lr"]))
    first, last = config["start_step"], config["steps"] - 1
    if replaying and first > 0:
        state = torch.load(checkpoint_path(dump_dir, first), map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    lag = int(config["rollout"]["max_head_offpolicyness"])
    run_t0 = time.perf_counter()
    tb_writer = (
        tensorboard_writer(config["stats_logger"]["tensorboard"]["path"]) if rank == 0 else None
    )
    history: list[dict[str, torch.Tensor]] = []  # recent weights, for a stale rollout policy
    rollout_model = copy.deepcopy(model)

    for step in range(first, last + 1):
        t0 = time.perf_counter()
        version = step  # optimizer updates applied so far (AReaL's global_step)
        if replaying:
            groups = torch.load(dump_path(dump_dir, step, dp_suffix), weights_only=True)
        else:
            history.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            del history[: max(0, len(history) - lag - 1)]
            rollout_model.load_state_dict(history[0])
            behaviour_version = max(0, version - lag)
            groups = generate_groups(rollout_model, config, step, rank, behaviour_version, device)
        dump_now = dumping and (td["dump_steps"] is None or step in td["dump_steps"])
        if dump_now:
            if rank == 0 and td["save_checkpoints"]:
                atomic_save(
                    {
                        "step": step,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    checkpoint_path(dump_dir, step),
                )
            if td["dump_scope"] == "rollout":
                atomic_save(groups, dump_path(dump_dir, step, dp_suffix))
        full_view: list[dict[str, torch.Tensor]] = []
        metrics = train_step(model, optimizer, groups, config, world_size, device, full_view)
        if dump_now and td["dump_scope"] == "full":
            atomic_save(full_view, dump_path(dump_dir, step, dp_suffix))
        if dump_now and td["max_keep"] is not None:
            rotate_dumps(dump_dir, dp_suffix, int(td["max_keep"]), set(td["pin_steps"]))
        if rank == 0:
            elapsed = round(time.perf_counter() - t0, 6)
            record = {"step": step, **metrics, "time_s": elapsed}
            write_jsonl(os.path.join(out_dir, METRICS_FILE), record)
            if dumping:
                write_jsonl(os.path.join(dump_dir, METRICS_FILE), record)
            print(
                f"step {step}: "
                + " ".join(f"{k}={_g(metrics[k])}" for k in METRIC_NAMES)
                + (" (replayed)" if replaying else ""),
                flush=True,
            )
            # AReaL's log is 1-based: "Train step N/T" is global step N-1 (stats_logger.py:
            # 138-141); T is total_train_steps, here `steps`.
            log_areal_step(step + 1, config["steps"], areal_stats(metrics, elapsed), tb_writer)
    if tb_writer is not None:
        tb_writer.close()
    if rank == 0 and hang == "none":
        # stats_logger.py:125 (StatsLogger.close); a run that hangs never gets here.
        print(
            areal_log_line(
                f"Training completes! Total time elapsed {time.perf_counter() - run_t0:.2f}.",
                time.time(),
            ),
            flush=True,
        )
    if world_size > 1 and hang != "none":
        hang_like_a_broken_job(hang, rank, world_size, device)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


# Hangs on purpose (debug.hang), shaped like AReaL's debugging guide's patterns


# How long a hung demo job stays hung (someone is looking at it; a soak watches it for an hour).
HANG_TIMEOUT = timedelta(hours=6)


def hang_like_a_broken_job(pattern: str, rank: int, world_size: int, device: torch.device) -> None:
    """Block forever the way a broken job does, after the recorded steps are safe on disk."""
    ranks = list(range(world_size))
    # Every rank creates the same groups (new_group is collective), then the ranks diverge.
    # New groups take torch's default timeout (30 min for gloo), not the one the process
    # group was started with: given here, or the hang ends by itself after 30 minutes.
    side_group = dist.new_group(ranks, timeout=HANG_TIMEOUT)
    rings = [dist.new_group(sorted({i, (i + 1) % world_size}), timeout=HANG_TIMEOUT)
             for i in ranks]  # fmt: skip
    grads = torch.zeros(8, device=device)
    print(f"rank {rank}: hanging on purpose (debug.hang={pattern})", flush=True)
    if pattern == "cleanup":
        if rank == world_size - 1:
            try:
                raise FloatingPointError(f"rank {rank}: loss is NaN")
            finally:
                cleanup_distributed(side_group)  # waits for ranks that are still training
        all_reduce_gradients(grads, None)
    elif pattern == "mismatch":
        if rank % 2 == 1:
            broadcast_parameters(grads, side_group)  # the others are in all_reduce: no match
        else:
            all_reduce_gradients(grads, None)
    elif pattern == "collective":
        # Each rank waits in the same all_reduce, on its own pair of a ring: none completes.
        all_reduce_gradients(grads, rings[rank])


def all_reduce_gradients(grads: torch.Tensor, group: Any) -> None:
    dist.all_reduce(grads, group=group)


def broadcast_parameters(params: torch.Tensor, group: Any) -> None:
    dist.broadcast(params, src=0, group=group)


def cleanup_distributed(group: Any) -> None:
    dist.barrier(group=group)
    dist.destroy_process_group()


def enable_flight_recorder() -> None:
    """Turn on torch's Flight Recorder (every collective: group, sequence id, op, sizes)
    and serve it from a C++ thread on `$TMPDIR/areal-fr-<pid>.sock`, where the console's
    agent asks for it even while this rank is blocked in a collective: the launch hook's
    server (process groups filled in), started in this process. It only records (2,000
    entries, a few hundred KB); results are unchanged."""
    hook = sys.modules.get("sitecustomize")
    if getattr(hook, "HANDLER", None) == fr_hook.HANDLER:
        return  # the hook is on this job's PYTHONPATH and already serves the record
    try:
        fr_hook.enable()  # torch is imported: the server starts now
    except (ImportError, AttributeError):  # a torch without it: the console shows stacks only
        return
