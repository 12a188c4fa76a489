"""Library frames are decided by package, never by install location (a pip-installed AReaL
or trainer is the user's code; torch, its dependencies and the stdlib are libraries)."""

from __future__ import annotations

import pytest
from areal_console.core.stacks import RankStack, StackCapture, Thread, analyse, diagnose
from areal_console.core.stacks.diagnose import short_where
from areal_console.core.stacks.library import is_library_file
from areal_console.core.stacks.records import Frame

SITE = "/usr/local/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("path", "library"),
    [
        (f"{SITE}/torch/distributed/distributed_c10d.py", True),
        (f"{SITE}/torch/distributed/c10d_logger.py", True),
        (f"{SITE}/numpy/core/numeric.py", True),
        (f"{SITE}/transformers/modeling_utils.py", True),
        (f"{SITE}/sglang/srt/entrypoints/http_server.py", True),
        (f"{SITE}/werkzeug/serving.py", True),
        (f"{SITE}/areal/engine/fsdp_engine.py", False),  # AReaL from PyPI: user code
        ("/home/u/.venv/lib/python3.11/site-packages/my_trainer/train.py", False),
        ("/usr/lib/python3/dist-packages/areal/trainer/rl_trainer.py", False),
        ("/usr/lib/python3.11/threading.py", True),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/concurrent/futures/_base.py", True),
        ("/opt/pytorch/torch/distributed/distributed_c10d.py", True),  # torch from source
        ("/home/u/AReaL/areal/engine/fsdp_engine.py", False),  # a source checkout
        # py-spy's short file names (text dumps, the guide's stacks)
        ("threading.py", True),
        ("concurrent/futures/_base.py", True),
        ("torch/distributed/distributed_c10d.py", True),
        ("areal/infra/rpc/rpc_server.py", False),
        ("sft_trainer.py", False),
        ("<frozen runpy>", True),
    ],
)
def test_library_by_package(path: str, library: bool) -> None:
    assert is_library_file(path) is library


def test_pip_installed_user_code_is_the_call_site_in_evidence_and_labels() -> None:
    def stack(site_line: int) -> tuple[Frame, ...]:
        return (
            Frame("barrier", f"{SITE}/torch/distributed/distributed_c10d.py", 4811),
            Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
            Frame("train_batch", f"{SITE}/areal/engine/fsdp_engine.py", site_line),
            Frame("run", "/usr/lib/python3.11/threading.py", 982),
        )

    ranks = [
        RankStack("n1", 100 + r, rank=r, world_size=2, threads=[
            Thread("MainThread", 100 + r, stack(610 + r), is_main=True)])
        for r in (0, 1)
    ]  # fmt: skip
    analysis = analyse(StackCapture("t", 1, ranks))
    d = diagnose(analysis)
    assert d.pattern == "collective_mismatch"
    assert d.evidence[0] == (
        f"rank 0 (1): train_batch ({SITE}/areal/engine/fsdp_engine.py:610) -> barrier "
        f"({SITE}/torch/distributed/distributed_c10d.py:4811)"
    )
    assert {short_where(g.frames) for g in analysis.groups} == {"train_batch > barrier"}


def test_the_work_thread_is_the_one_in_torch_distributed_or_the_engine() -> None:
    serve = (Frame("select", "selectors.py", 415), Frame("serve_forever", "socketserver.py", 233))
    coll = (
        Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2501),
        Frame("train_batch", "areal/engine/fsdp_engine.py", 700),
    )
    engine = (
        Frame("forward", "torch/nn/modules/module.py", 1500),
        Frame("train_batch", "areal/engine/fsdp_engine.py", 690),
    )
    parked = (Frame("get", "queue.py", 171), Frame("engine_worker", "areal/infra/rpc/x.py", 9))

    def rank(*threads: Thread) -> RankStack:
        return RankStack("n", 1, rank=0, threads=list(threads))

    main = Thread("MainThread", 1, serve, is_main=True)
    # In a collective: wins over any name.
    assert rank(main, Thread("Thread-7", 2, coll)).work_frames == coll
    # AReaL's engine thread, even parked (it says: no work arrived).
    assert rank(main, Thread("EngineWorker", 3, parked, idle=True)).work_frames == parked
    # A busy thread in AReaL's engine code, whatever its name.
    assert rank(main, Thread("worker", 4, engine)).work_frames == engine
    # Otherwise the main thread.
    assert rank(main, Thread("pool", 5, parked, idle=True)).work_frames == serve
