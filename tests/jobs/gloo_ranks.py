"""A small real torch.distributed (gloo, CPU) job for tests: every rank joins, does one
all_reduce to prove the group works, writes a ready file, then waits in a barrier that never
completes (rank WORLD_SIZE-1 never enters it) until the job is killed."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    ready_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.ones(4) * (rank + 1)
    dist.all_reduce(value)
    with open(os.path.join(ready_dir, f"rank{rank}.ready"), "w") as fh:
        fh.write(f"{value.sum().item()}\n")
    if rank == world - 1:
        while True:
            time.sleep(3600)
    dist.barrier()


if __name__ == "__main__":
    main()
