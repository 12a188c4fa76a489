"""A gloo job placed as Ray actors: `python ray_gloo.py ADDRESS PATTERN STATE_DIR PORT REPO`.

Ranks go two per node over the cluster's alive nodes (ordered by IP, so rank 0 is on the
head), each a `RankWorker` actor pinned to its node with its rank variables in its
runtime environment (as Ray's launchers pass them), running one hang pattern of
`tests/support/fixtures/hang.py`. Each rank takes CPUS_PER_RANK CPUs, so the job fills every
node's CPUs (an agent that reserved a CPU could not be placed). The ranks' environment
also carries a W&B key and a Hugging Face token, as a real job's does (random, written to
STATE_DIR/planted.json for the tests that check the console masks them). The driver stays
until it is killed; its actors die with it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

RANKS_PER_NODE = 2
CPUS_PER_RANK = 2


@ray.remote
class RankWorker:
    def run(self, pattern: str, state_dir: str) -> None:
        import tests.support.fixtures.hang as hang

        trainer = hang.Trainer(pattern, state_dir)
        trainer.init_distributed()
        trainer.train(1_000_000)


def main() -> None:
    address, pattern, state_dir, port, repo, nodes_wanted = sys.argv[1:7]
    # A namespace per run: a job started again finds no actor names of the last one.
    namespace = f"areal-test-job-{os.path.basename(state_dir)}"
    ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level="ERROR")
    nodes = sorted(
        (n for n in ray.nodes() if n["Alive"]),
        key=lambda n: tuple(map(int, n["NodeManagerAddress"].split("."))),
    )[: int(nodes_wanted)]
    world = len(nodes) * RANKS_PER_NODE
    planted = {"WANDB_API_KEY": secrets.token_hex(20), "HF_TOKEN": "hf_" + secrets.token_hex(16)}
    with open(os.path.join(state_dir, "planted.json"), "w") as fh:
        json.dump(planted, fh)
    runs = []
    for rank in range(world):
        node = nodes[rank // RANKS_PER_NODE]
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % RANKS_PER_NODE),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(RANKS_PER_NODE),
            "MASTER_ADDR": nodes[0]["NodeManagerAddress"],
            "MASTER_PORT": port,
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": repo,
            "NCCL_DEBUG": "INFO",
            **planted,
        }
        worker = RankWorker.options(
            name=f"rank-{rank}",
            num_cpus=CPUS_PER_RANK,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            runtime_env={"env_vars": env},
        ).remote()
        runs.append(worker.run.remote(pattern, state_dir))
    print(f"started {world} ranks on {len(nodes)} nodes", flush=True)
    signal.pause()  # SIGTERM ends the driver; Ray then ends its actors


if __name__ == "__main__":
    main()
