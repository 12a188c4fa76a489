"""Replay speed and exactness of the reference trainer.

1. Time to reach and run step N: the original run (sampling rollouts for steps 1..N, no
   dumping) vs a replay that starts at step N from the checkpoint saved with its dump.
   Whole processes, best of `--repeat`, in the same run on the same machine; the ratio is
   what matters. The cost of `import torch` alone is measured too, since it is part of both.
2. The same inside the process, from the metrics' per-step `time_s`: steps 1..N with
   rollouts vs the replayed step N.
3. Bit-for-bit check: several seeds, each replayed from step 1, from the middle
   checkpoint and from step N alone, compared metric by metric with the recording.

    python bench/bench_replay.py [--steps 16] [--seeds 1,2,3] [--batch 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents")]

from areal_console.core.replay import TRAINER_PATH, parse_metrics, verify  # noqa: E402


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{proc.stderr.strip()}")
    return time.perf_counter() - t0


def trainer(*args: str) -> float:
    """Run the trainer; wall seconds."""
    return timed([sys.executable, str(TRAINER_PATH), *args])


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
            for first in sorted({1, max(1, n // 2), n}):
                out = root / f"replay-{seed}-{first}"
                trainer(
                    *common,
                    *replay,
                    f"start_step={first}",
                    f"steps={n}",
                    f"trajectory_debug.path={dump}",
                    f"output_dir={out}",
                )
                result = verify(recorded, metrics(out / "metrics.jsonl"), (first, n))
                checks[f"{first}-{n}"] = result.matched
            exact.append({"seed": seed, "checks": checks})

        # Speed: best of --repeat whole processes.
        dump = root / f"seed{seeds[0]}"
        import_s = min(timed([sys.executable, "-c", "import torch"]) for _ in range(opts.repeat))
        original_s = min(
            trainer(*common, f"seed={seeds[0]}", f"steps={n}", f"output_dir={root / 'orig'}")
            for _ in range(opts.repeat)
        )
        orig_steps = metrics(root / "orig" / "metrics.jsonl")
        replay_s = min(
            trainer(
                *common,
                *replay,
                f"start_step={n}",
                f"steps={n}",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'jump'}",
            )
            for _ in range(opts.repeat)
        )
        jump_steps = metrics(root / "jump" / "metrics.jsonl")

    in_orig = sum(orig_steps[s]["time_s"] for s in range(1, n + 1))
    in_replay = jump_steps[n]["time_s"]
    print(
        f"reference trainer: {n} steps, {opts.batch} prompts x 4 samples per step, CPU, "
        f"1 thread; best of {opts.repeat}"
    )
    print(f"  import torch alone               {import_s:8.2f} s")
    print(f"  original run, steps 1..{n:<3}       {original_s:8.2f} s")
    print(f"  replay from checkpoint, step {n:<3} {replay_s:8.2f} s")
    print(f"  ratio replay/original (wall)      {replay_s / original_s:8.2f}")
    print(
        f"  ratio without the torch import    "
        f"{(replay_s - import_s) / max(original_s - import_s, 1e-9):8.2f}"
    )
    print(
        f"  in-process: steps 1..{n} {in_orig * 1e3:.1f} ms vs step {n} replayed "
        f"{in_replay * 1e3:.1f} ms, ratio {in_replay / in_orig:.3f}"
    )
    print("bit-identical replays (recorded metrics vs replayed, every step):")
    for row in exact:
        print(
            f"  seed {row['seed']}: "
            + ", ".join(f"steps {k}: {'yes' if v else 'NO'}" for k, v in row["checks"].items())
        )
    ok = all(all(r["checks"].values()) for r in exact)
    print("all bit-identical:", "yes" if ok else "NO")
    print(
        json.dumps(
            {
                "import_s": import_s,
                "original_s": original_s,
                "replay_s": replay_s,
                "in_process_original_s": in_orig,
                "in_process_replay_s": in_replay,
                "exact": exact,
            }
        )
    )
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
