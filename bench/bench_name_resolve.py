"""Resolving an AReaL job's name-resolve records vs listing the same tree with `find`.

    python bench/bench_name_resolve.py [--workers 512] [--rounds 20]

Writes a job's records the way AReaL's NfsNameRecordRepository writes them (one
`ENTRY` per worker under `{user}/{experiment}/{trial}/workers/{role}/{index}`, plus
rollout servers under `gen_servers`; tests/support/areal_name_resolve.py) into a fresh record
root, next to a second trial of the same size, then measures in the same run:

- find: `find ROOT/USER/EXP/TRIAL -name ENTRY` (a subprocess, as a user would list them);
- resolve: what `--areal` does before probing: walk the job's tree, open every `ENTRY`
  without following links, check its owner, read it and type it (`NfsRegistry.job`).

Medians of the rounds; the ratio resolve/find is the figure (docs/benchmarks/name-resolve.md).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.targets.name_resolve import NfsRegistry, current_user, parse_job_name  # noqa: E402

from tests.support.areal_name_resolve import gen_server_key, nfs_add, worker_key  # noqa: E402

ROLES = ("actor", "ref", "rollout", "critic")


def write_job(root: Path, user: str, experiment: str, trial: str, workers: int) -> None:
    per_role = workers // len(ROLES)
    for role in ROLES:
        for index in range(per_role):
            port = 20000 + index
            nfs_add(
                str(root),
                worker_key(user, experiment, trial, role, index),
                f"10.0.{index // 8}.1:{port}",
            )
    for _ in range(workers // 64):
        nfs_add(str(root), gen_server_key(user, experiment, trial), "10.1.0.1:30000")


def timed(fn: object, rounds: int) -> tuple[float, object]:
    samples = []
    result = None
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    user = current_user()
    with tempfile.TemporaryDirectory(prefix="bench-nr-") as tmp:
        root = Path(tmp) / "name_resolve"
        write_job(root, user, "bench", "trial1", args.workers)
        write_job(root, user, "bench", "trial2", args.workers)  # a neighbour, not read
        job_dir = root / user / "bench" / "trial1"
        name = parse_job_name(f"{user}/bench/trial1")
        registry = NfsRegistry(str(root))

        def find() -> int:
            out = subprocess.run(
                ["find", str(job_dir), "-name", "ENTRY"], capture_output=True, check=True
            ).stdout
            return out.count(b"\n")

        def resolve() -> int:
            return len(registry.job(name).entries)

        find(), resolve()  # warm the dentry cache for both alike
        t_find, n_find = timed(find, args.rounds)
        t_resolve, n_resolve = timed(resolve, args.rounds)
    assert n_find == n_resolve, (n_find, n_resolve)
    print(f"records: {n_find} ({args.workers} workers + {n_find - args.workers} servers)")
    print(f"find    : {t_find * 1000:7.2f} ms (median of {args.rounds})")
    print(f"resolve : {t_resolve * 1000:7.2f} ms (median of {args.rounds})")
    print(f"ratio resolve/find: {t_resolve / t_find:.2f}x (bar: <= 2x)")


if __name__ == "__main__":
    main()
