"""A real 4-rank gloo job for the collective ledger: three matching all_reduces (#1-#3 on
the default group), then each rank writes `rank<N>.ready` and does what MODE says:

- `op`: rank 3 calls broadcast while the others call all_reduce (#4).
- `size`: rank 2 all_reduces 5 floats, the others 8 (#4); gloo lets rank 2's call
  return, so it waits in the barrier that follows (#5).
- `behind`: rank 1 waits in a barrier of the `grads` group the others never enter; the
  others are in all_reduce #4 of the default group, so rank 1 is one call behind there.
- `crashed`: rank 3 raises (the hook writes its dump file on the way out; a stand-in
  keeps its sockets open); the others wait in all_reduce #4.
- `died`: rank 3 exits at once (a stand-in keeps its sockets open, so the others hang as
  they would on GPUs); the others wait in all_reduce #4.
- `wrong_group`: every rank calls the same `all_reduce` line, but rank 3 passes the
  tensor-parallel group [2, 3] instead of the default one: rank 3 waits in the tp group
  for rank 2, rank 2 in the default group for rank 3 (ranks 0-1 wait on them).
- `three_groups`: rank 0 all_reduces on group [0, 1], rank 1 on [1, 2], rank 2 on [0, 2]
  (a cycle through three groups); rank 3 waits in the default group for all three.
- `chain` (6 ranks): rank i < 5 all_reduces on the pair [i, i+1]; rank 5 sleeps, so
  everyone waits on it through the ranks after them.

`FR_DEBUG_SERVER=1` (not on rank 0): the rank also starts torch's debug worker server
(`torch.distributed.debug.start_debug_server`) before it hangs.

Run with the recorder hook on PYTHONPATH. `FR_TIMEOUT_S` (default a day) is the
process-group timeout: a short one makes the ranks fail and write their dump files.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    mode, ready_dir = sys.argv[1], sys.argv[2]
    timeout = datetime.timedelta(seconds=float(os.environ.get("FR_TIMEOUT_S", "86400")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    grads = dist.new_group(list(range(dist.get_world_size())), group_desc="grads")
    x = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(x)
    tp = [dist.new_group(r) for r in ([0, 1], [2, 3])] if mode == "wrong_group" else []
    ring = [dist.new_group(r) for r in ([0, 1], [1, 2], [0, 2])] if mode == "three_groups" else []
    world = dist.get_world_size()
    if os.environ.get("FR_DEBUG_SERVER") == "1":
        # torch's own per-rank worker server on a TCP port, registered in the job's store
        # (no frontend: that one starts on rank 0 only, and needs aiohttp)
        from torch.distributed.debug import start_debug_server

        start_debug_server(worker_port=0)
    pairs = [dist.new_group([i, i + 1]) for i in range(world - 1)] if mode == "chain" else []
    with open(os.path.join(ready_dir, f"rank{rank}.ready"), "w") as fh:
        fh.write(str(os.getpid()))
    if mode in ("wrong_group", "three_groups", "chain"):
        group = None
        if mode == "wrong_group" and rank == 3:
            group = tp[1]  # the bug: the tp group where the default one was meant
        elif mode == "three_groups" and rank < 3:
            group = ring[rank]
        elif mode == "chain" and rank < world - 1:
            group = pairs[rank]
        elif mode == "chain":
            time.sleep(86400)  # the root: busy elsewhere, never reaches its collective
        dist.all_reduce(x, group=group)
    elif mode == "op" and rank == 3:
        dist.broadcast(x, src=0)
    elif mode == "size":
        dist.all_reduce(torch.ones(5 if rank == 2 else 8))
    elif mode == "behind" and rank == 1:
        dist.barrier(group=grads)
    elif mode in ("died", "crashed") and rank == 3:
        if os.fork() == 0:
            os.execve("/bin/sleep", ["sleep", "86400"], {"PATH": "/usr/bin:/bin"})
        if mode == "crashed":
            raise RuntimeError("rank 3: loss is NaN")
        os._exit(1)
    else:
        dist.all_reduce(x)
    dist.barrier()  # a rank whose mismatched call returned waits here (#5)


if __name__ == "__main__":
    main()
