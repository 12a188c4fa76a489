"""An AReaL-style single-controller run for tests (stands in for
`python3 examples/math/gsm8k_rl.py --config ... scheduler.type=local`).

Starts each worker exactly as AReaL's LocalScheduler does (areal/infra/scheduler/local.py:
777-831 and areal/infra/utils/proc.py:26-173 at cbff54d6): `/bin/bash -c "ENV stdbuf -oL
python3 -m areal.infra.rpc.rpc_server --port P --experiment-name E --trial-name T --role R
--worker-index N --name-resolve-type nfs --nfs-record-root ... --etcd3-addr ... --fileroot F
2>&1 | tee -a LOG/R.log >(stdbuf -oL sed 's/^/[R] /' >> LOG/merged.log)"`, then sends each
training worker RANK/WORLD_SIZE/MASTER_* over `POST /set_env` (train_controller.py:336-344).

Usage: areal_controller.py WORKDIR MODE N_ACTORS [SERVER_HEALTH [SCRIPT ARGS...]]
  MODE collective: the actors all_reduce, then all but the last wait in a barrier
                   (in their EngineWorker threads); this process waits on their replies.
  MODE rollout:    a rollout worker starts an SGLang stand-in server (SERVER_HEALTH:
                   healthy | unhealthy | dead); this process waits in
                   RolloutController.prepare_batch, blocked by staleness control, after
                   logging its accepted rollouts (rollout tracing on) to main.log.
  MODE weight_update: a rollout worker starts a data proxy stand-in, paused at version 3;
                   the actors run FSDPEngine.update_weights (after writing their perf
                   tracer files): all but the last wait in the bucket broadcast, the last
                   waits for the paused server, all inside the weight-update path.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

EXPERIMENT = "gsm8k-grpo"
TRIAL = "trial0"  # the work directory's name, set in main()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_dir(workdir: Path) -> Path:
    """AReaL's log directory, where LocalScheduler's role logs and merged.log go and where
    save_config writes config.yaml: <fileroot>/logs/<user>/<experiment>/<trial>
    (areal/infra/scheduler/local.py:159-165, areal/utils/stats_logger.py:179)."""
    return workdir / "logs" / getpass.getuser() / EXPERIMENT / TRIAL


def save_config(workdir: Path) -> None:
    """config.yaml as AReaL's save_config writes it (areal/api/cli_args.py:3568-3579), the
    few keys this run has (its staleness settings in `rollout:`, as asdict orders them,
    areal/api/cli_args.py:2487-2509); the W&B key and URL come from the environment."""
    wandb_key = os.environ.get("WANDB_API_KEY", "")
    wandb_url = os.environ.get("AREAL_STUB_WANDB_BASE_URL", "")
    (log_dir(workdir) / "config.yaml").write_text(
        f"experiment_name: {EXPERIMENT}\ntrial_name: {TRIAL}\ncluster:\n"
        f"  fileroot: {workdir}\nstats_logger:\n  wandb:\n    mode: disabled\n"
        f"    wandb_base_url: '{wandb_url}'\n    wandb_api_key: '{wandb_key}'\n"
        "rollout:\n  max_concurrent_rollouts: 4\n  queue_size: null\n  consumer_batch_size: 4\n"
        "  max_head_offpolicyness: 0\n"
    )


def start_worker(role: str, index: int, workdir: Path) -> int:
    port = free_port()
    logs = log_dir(workdir)
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "areal.infra.rpc.rpc_server", "--port", str(port),
        "--experiment-name", EXPERIMENT, "--trial-name", TRIAL, "--role", role,
        "--worker-index", str(index), "--name-resolve-type", "nfs",
        "--nfs-record-root", str(workdir / "name_resolve"), "--etcd3-addr", "localhost:2379",
        "--fileroot", str(workdir),
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    target = " ".join(shlex.quote(part) for part in cmd)
    tag = f"[{role}]".ljust(12)
    shell = (
        f"{prefix} stdbuf -oL {target} 2>&1 | tee -a {logs / (role + '.log')} "
        f">(stdbuf -oL sed 's/^/{tag}/' >> {logs / 'merged.log'})"
    )
    subprocess.Popen(shell, shell=True, executable="/bin/bash")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return port
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"worker {role}/{index} did not come up")


def post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def main() -> None:
    global TRIAL
    workdir, mode, n_actors = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    # One trial per run: test runs in parallel on one machine never share a job.
    TRIAL = os.environ.get("AREAL_STUB_TRIAL") or workdir.name
    health = sys.argv[4] if len(sys.argv) > 4 else "healthy"
    # Further arguments are the training script's own (AReaL's `key=value` overrides and
    # flags): taken and ignored, as the stand-in trains nothing.
    log_dir(workdir).mkdir(parents=True, exist_ok=True)
    save_config(workdir)
    ports = [start_worker("actor", i, workdir) for i in range(n_actors)]
    master_port = free_port()
    for rank, port in enumerate(ports):
        post(port, "/set_env", {"env": {
            "RANK": str(rank), "WORLD_SIZE": str(n_actors), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port), "LOCAL_RANK": "0",
        }})  # fmt: skip
    if mode == "collective":
        calls = [
            threading.Thread(
                target=post,
                args=(port, "/call", {"method": "train_batch",
                                      "kwargs": {"ready_file": str(workdir / f"rank{rank}.ready")}}),
                daemon=True,
            )
            for rank, port in enumerate(ports)
        ]  # fmt: skip
        for call in calls:
            call.start()
        for call in calls:
            call.join()
        return
    logs = log_dir(workdir)
    if mode == "weight_update":
        rollout = start_worker("rollout", 0, workdir)
        proxy_port = free_port()
        args = ["--host", "127.0.0.1", "--port", str(proxy_port)]
        env = {"STUB_PAUSED": "1", "STUB_VERSION": os.environ.get("STUB_SERVER_VERSION") or "3"}
        reply = post(
            rollout, "/call", {"method": "launch_data_proxy", "kwargs": {"args": args, "env": env}}
        )
        (workdir / "server.json").write_text(
            json.dumps({"pid": reply["result"], "port": proxy_port})
        )
        calls = [
            threading.Thread(
                target=post,
                args=(port, "/call", {"method": "update_weights", "kwargs": {
                    "log_dir": str(logs), "ready_file": str(workdir / f"rank{rank}.ready")}}),
                daemon=True,
            )
            for rank, port in enumerate(ports)
        ]  # fmt: skip
        for call in calls:
            call.start()
        while len(list(workdir.glob("rank*.ready"))) < n_actors:
            time.sleep(0.1)
        (workdir / "controller.ready").write_text("waiting for the weight update\n")
        for call in calls:
            call.join()
        return
    from areal.infra.controller.rollout_controller import RolloutController

    rollout = start_worker("rollout", 0, workdir)
    server_port = free_port()
    args = ["--model-path", "stub-model", "--host", "127.0.0.1", "--port", str(server_port)]
    reply = post(rollout, "/call", {"method": "launch_server",
                                    "kwargs": {"args": args, "env": {"STUB_HEALTH": health}}})  # fmt: skip
    (workdir / "server.json").write_text(json.dumps({"pid": reply["result"], "port": server_port}))
    controller = RolloutController(
        max_concurrent_rollouts=4,
        consumer_batch_size=4,
        max_head_offpolicyness=0,
        log_dir=str(logs),
    )
    (workdir / "controller.ready").write_text("waiting for rollout\n")
    controller.prepare_batch([{"prompt": "1+1="}], batch_size=4)


if __name__ == "__main__":
    main()
