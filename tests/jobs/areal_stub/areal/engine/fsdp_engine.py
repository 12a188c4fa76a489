"""Stand-in for AReaL's FSDP engine weight update (tests only): the call chain of
areal/engine/fsdp_engine.py at cbff54d (`update_weights` :620 -> `_update_weights_from_
distributed` :1596 -> `_update_bucket_weights_from_distributed` :1456, which broadcasts
each bucket to the inference servers' group). Here the group is the actors' gloo group;
the last rank never reaches the broadcast (it waits for a server that stays paused), so
the others wait in it: ranks stuck inside the weight-update path.

Before the update each rank writes the perf tracer spans of the steps it finished, as
AReaL's PerfTracer writes them (tests/support/fixtures/perf_tracer_files.py, found through
STUB_TESTS_ROOT); the last rank is one step behind. `STUB_STEPS` (default 4) is the
steps rank 0 finished: the trainer's version the files say."""

from __future__ import annotations

import datetime
import os
import sys
import time


def _write_traces(rank: int, world: int, log_dir: str) -> None:
    sys.path.insert(0, os.environ["STUB_TESTS_ROOT"])
    from pathlib import Path

    from tests.support.fixtures.perf_tracer_files import TranscribedPerfTracer, write_steps

    tracer = TranscribedPerfTracer(Path(log_dir), rank, role="actor", pid=os.getpid())
    steps = int(os.environ.get("STUB_STEPS") or 4)
    write_steps(tracer, steps - 1 if rank == world - 1 else steps)


class FSDPEngine:
    def update_weights(self, log_dir: str, ready_file: str) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
        _write_traces(dist.get_rank(), dist.get_world_size(), log_dir)
        self._update_weights_from_distributed(ready_file)

    def _update_weights_from_distributed(self, ready_file: str) -> None:
        self._update_bucket_weights_from_distributed(ready_file)

    def _update_bucket_weights_from_distributed(self, ready_file: str) -> None:
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        with open(ready_file, "w") as fh:
            fh.write(f"{rank}\n")
        if rank == world - 1:
            while True:  # the server never answers: it stays paused
                time.sleep(3600)
        dist.broadcast(torch.zeros(8), src=world - 1)
