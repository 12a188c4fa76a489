"""Replay speed and exactness of the reference trainer.

1. Time to reach and run step N: the original run (sampling rollouts for steps 0..N-1, no
   dumping) vs a replay that starts at step N-1 from the checkpoint saved with its dump.
   Whole processes, best of `--repeat`, in the same run on the same machine; the ratio is
   what matters. The cost of `import torch` alone is measured too, since it is part of both.
2. The same inside the process, from the metrics' per-step `time_s`: steps 0..N-1 with
   rollouts vs the replayed step N-1.
3. Bit-for-bit check: several seeds, each replayed from step 0, from the middle
   checkpoint and from step N-1 alone, compared metric by metric with the recording.

    python bench/bench_replay.py [--steps 16] [--seeds 1,2,3] [--batch 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.replay.plan import local_trainer, parse_metrics, verify  # noqa: E402

CPU_SECONDS: dict[str, float] = {}  # CPU time (user + sys) of the last process run


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one process; its CPU seconds go to CPU_SECONDS["last"]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{proc.stderr.strip()}")
    CPU_SECONDS["last"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall


def best(runs: int, fn: Callable[[], float]) -> tuple[float, float]:
    """(best wall, best CPU) seconds over `runs` calls of `fn`."""
    walls, cpus = [], []
    for _ in range(runs):
        walls.append(fn())
        cpus.append(CPU_SECONDS["last"])
    return min(walls), min(cpus)


def trainer(*args: str) -> float:
    """Run the trainer; wall seconds."""
    return timed(*local_trainer(*args))


def metrics(path: Path) -> dict[int, dict]:
    return parse_metrics(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--batch", type=int, default=16, help="prompts per step")
    parser.add_argument("--repeat", type=int, default=3, help="timing runs (best is kept)")
    opts = parser.parse_args()
    n = opts.steps
    seeds = [int(s) for s in opts.seeds.split(",")]
    common = [f"train_dataset.batch_size={opts.batch}"]
    replay = ["trajectory_debug.replay_rollout_data=true"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Exactness over seeds and start steps.
        exact = []
        for seed in seeds:
            dump = root / f"seed{seed}"
            trainer(
                *common,
                f"seed={seed}",
                f"steps={n}",
                "trajectory_debug.dump_rollout_data=true",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'rec'}",
            )
            recorded = metrics(dump / "metrics.jsonl")
            checks = {}
            last = n - 1  # global steps run 0..n-1, as AReaL numbers them
            for first in sorted({0, max(0, n // 2), last}):
                out = root / f"replay-{seed}-{first}"
                trainer(
                    *common,
                    *replay,
                    f"start_step={first}",
                    f"steps={n}",
                    f"trajectory_debug.path={dump}",
                    f"output_dir={out}",
                )
                result = verify(recorded, metrics(out / "metrics.jsonl"), (first, last))
                checks[f"{first}-{last}"] = result.matched
            exact.append({"seed": seed, "checks": checks})

        # Speed: best of --repeat whole processes (wall and CPU time).
        dump = root / f"seed{seeds[0]}"
        import_s, import_cpu = best(
            opts.repeat, lambda: timed([sys.executable, "-c", "import torch"])
        )
        original_s, original_cpu = best(
            opts.repeat,
            lambda: trainer(
                *common, f"seed={seeds[0]}", f"steps={n}", f"output_dir={root / 'orig'}"
            ),
        )
        orig_steps = metrics(root / "orig" / "metrics.jsonl")
        replay_s, replay_cpu = best(
            opts.repeat,
            lambda: trainer(
                *common,
                *replay,
                f"start_step={n - 1}",
                f"steps={n}",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'jump'}",
            ),
        )
        jump_steps = metrics(root / "jump" / "metrics.jsonl")

    in_orig = sum(orig_steps[s]["time_s"] for s in range(n))
    in_replay = jump_steps[n - 1]["time_s"]
    print(
        f"reference trainer: {n} steps, {opts.batch} prompts x 4 samples per step, CPU, "
        f"1 thread; best of {opts.repeat}"
    )
    print(f"{'':34}{'wall':>8}{'CPU':>8}")
    rows = [
        ("import torch alone", import_s, import_cpu),
        (f"original run, steps 0..{n - 1}", original_s, original_cpu),
        (f"replay from checkpoint, step {n - 1}", replay_s, replay_cpu),
    ]
    for label, wall, cpu in rows:
        print(f"  {label:32}{wall:7.2f}s{cpu:7.2f}s")
    print(
        f"  {'ratio replay / original':32}{replay_s / original_s:8.2f}"
        f"{replay_cpu / original_cpu:8.2f}"
    )

    def beyond_import(replayed: float, original: float, base: float) -> str:
        # Under heavy load the import alone can take longer than a whole run: no ratio then.
        if original - base <= 0.05 * original or replayed < base:
            return "n/a"
        return f"{(replayed - base) / (original - base):.2f}"

    print(
        f"  {'same, torch import subtracted':32}"
        f"{beyond_import(replay_s, original_s, import_s):>8}"
        f"{beyond_import(replay_cpu, original_cpu, import_cpu):>8}"
    )
    print(
        f"  in-process (the steps' time_s): steps 0..{n - 1} {in_orig * 1e3:.1f} ms vs step {n - 1} "
        f"replayed {in_replay * 1e3:.1f} ms, ratio {in_replay / in_orig:.3f}"
    )
    print("bit-identical replays (recorded metrics vs replayed, every step):")
    for row in exact:
        checks = ", ".join(f"steps {k}: {'yes' if v else 'NO'}" for k, v in row["checks"].items())
        print(f"  seed {row['seed']}: {checks}")
    ok = all(all(r["checks"].values()) for r in exact)
    print("all bit-identical:", "yes" if ok else "NO")
    summary = {
        "import_s": import_s,
        "original_s": original_s,
        "replay_s": replay_s,
        "import_cpu_s": import_cpu,
        "original_cpu_s": original_cpu,
        "replay_cpu_s": replay_cpu,
        "in_process_original_s": in_orig,
        "in_process_replay_s": in_replay,
        "exact": exact,
    }
    print(json.dumps(summary))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
