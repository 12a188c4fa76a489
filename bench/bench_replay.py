"""Replay speed and exactness of the reference trainer.

1. Time to reach and run step N: the original run (sampling rollouts for steps 1..N) vs a
   replay that starts at step N from the checkpoint saved with its dump. Both are whole
   processes, measured in the same run on the same machine; the ratio is what matters.
2. Per-step time, rollout + train vs replayed train only (from the metrics' `time_s`).
3. Bit-for-bit check: several seeds, each replayed from step 1 and from a later
   checkpointed step, compared metric by metric with the recording.

    python bench/bench_replay.py [--steps 8] [--seeds 1,2,3] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents")]

from areal_console.core.replay import TRAINER_PATH, parse_metrics, verify  # noqa: E402


def trainer(*args: str) -> float:
    """Run the trainer; wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(TRAINER_PATH), *args], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"trainer failed: {proc.stderr.strip()}")
    return time.perf_counter() - t0


def metrics(path: Path) -> dict[int, dict]:
    return parse_metrics(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--batch", type=int, default=16, help="prompts per step")
    opts = parser.parse_args()
    n = opts.steps
    common = [f"train_dataset.batch_size={opts.batch}"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = []
        for seed in [int(s) for s in opts.seeds.split(",")]:
            dump = root / f"seed{seed}"
            record_s = trainer(
                *common,
                f"seed={seed}",
                f"steps={n}",
                "trajectory_debug.dump_rollout_data=true",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'rec'}",
            )
            recorded = metrics(dump / "metrics.jsonl")
            full_s = trainer(
                *common,
                f"steps={n}",
                "trajectory_debug.replay_rollout_data=true",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'full'}",
            )
            full = verify(recorded, metrics(root / "full" / "metrics.jsonl"), (1, n))
            jump_s = trainer(
                *common,
                f"start_step={n}",
                f"steps={n}",
                "trajectory_debug.replay_rollout_data=true",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'jump'}",
            )
            jump = verify(recorded, metrics(root / "jump" / "metrics.jsonl"), (n, n))
            mid = max(1, n // 2)
            trainer(
                *common,
                f"start_step={mid}",
                f"steps={n}",
                "trajectory_debug.replay_rollout_data=true",
                f"trajectory_debug.path={dump}",
                f"output_dir={root / 'mid'}",
            )
            middle = verify(recorded, metrics(root / "mid" / "metrics.jsonl"), (mid, n))
            replay_steps = metrics(root / "full" / "metrics.jsonl")
            rows.append(
                {
                    "seed": seed,
                    "record_s": record_s,
                    "reach_step_n_replay_s": jump_s,
                    "full_replay_s": full_s,
                    "reach_in_process_original_s": sum(
                        recorded[s]["time_s"] for s in range(1, n + 1)
                    ),
                    "reach_in_process_replay_s": metrics(root / "jump" / "metrics.jsonl")[n][
                        "time_s"
                    ],
                    "step_s_original": statistics.median(r["time_s"] for r in recorded.values()),
                    "step_s_replay": statistics.median(r["time_s"] for r in replay_steps.values()),
                    "bit_identical": {
                        f"1-{n}": full.matched,
                        f"{mid}-{n}": middle.matched,
                        f"{n}": jump.matched,
                    },
                }
            )
    print("wall: whole processes (torch import included); in-process: the steps' own time_s")
    print(f"reference trainer, {n} steps, {opts.batch} prompts x 4 samples per step, CPU, 1 thread")
    print(
        f"{'seed':>4} {'record 1..N':>12} {'replay N only':>14} {'ratio':>6} "
        f"{'steps 1..N':>11} {'step N':>9} {'ratio':>6} "
        f"{'step orig':>10} {'step replay':>12} {'ratio':>6}  bit-identical"
    )
    for r in rows:
        orig, rep = r["reach_in_process_original_s"], r["reach_in_process_replay_s"]
        print(
            f"{r['seed']:>4} {r['record_s']:>11.2f}s {r['reach_step_n_replay_s']:>13.2f}s "
            f"{r['reach_step_n_replay_s'] / r['record_s']:>6.2f} "
            f"{orig * 1e3:>9.1f}ms {rep * 1e3:>7.1f}ms {rep / orig:>6.2f} "
            f"{r['step_s_original'] * 1e3:>8.1f}ms {r['step_s_replay'] * 1e3:>10.1f}ms "
            f"{r['step_s_replay'] / r['step_s_original']:>6.2f}  "
            + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in r["bit_identical"].items())
        )
    all_ok = all(all(r["bit_identical"].values()) for r in rows)
    print("all replays bit-identical:", "yes" if all_ok else "NO")
    print(json.dumps(rows))
    if not all_ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
