"""Summary of a ~1 GB trajectory dump vs a plain `torch.load` plus naive statistics.

Writes one `step_000001.pt` of about `--gb` GB in AReaL's layout, then measures, each in a
fresh subprocess (so peak memory is that of the measured work alone), repeated `--repeat`
times (median reported):

  summary  areal_console's summary (memory-mapped, masks + a few elements per sample)
  naive    torch.load(weights_only=True) of everything, then the same headline stats
  sample   opening one sample in a fresh process (load + its group only)

with the file's pages warm in the page cache (read in full right before timing) and cold
(evicted with posix_fadvise(DONTNEED) right before timing). Prints a table and the
naive/summary ratios.

    python bench/bench_batches.py [--gb 1.0] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, os, sys, time
import torch

def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

mode, path, cold = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
torch.zeros(1).sum()  # torch's lazy init is not part of either measurement
from areal_node import batches
fd = os.open(path, os.O_RDONLY)
if cold:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
else:
    # Warm the page cache right before timing: on a shared machine others may drop it.
    while os.read(fd, 16 << 20):
        pass
os.close(fd)
before = peak_kb()
t0 = time.perf_counter()
if mode == "summary":
    s = batches.summarize(path, eos_token_id=2)
    out = {"samples": s["samples"], "reward_mean": s["stats"]["reward"]["mean"]}
elif mode == "sample":
    v = batches.sample_view(path, 1000, eos_token_id=2)
    out = {"seq_len": v["seq_len"]}
else:
    groups = torch.load(path, weights_only=True, map_location="cpu")
    seq = torch.cat([g["attention_mask"].sum(-1) for g in groups]).double()
    resp = torch.cat([g["loss_mask"].sum(-1) for g in groups]).double()
    rewards = torch.cat([g["rewards"] for g in groups]).double()
    last = torch.cat([g["input_ids"].gather(1, (g["attention_mask"].sum(-1, keepdim=True) - 1))
                      for g in groups]).squeeze(1)
    w = torch.cat([torch.exp(g["prox_logp"] - g["logprobs"])[g["loss_mask"].bool()]
                   for g in groups])
    out = {"samples": int(seq.numel()), "reward_mean": float(rewards.mean()),
           "seq_len": float(seq.mean()), "resp": float(resp.mean()),
           "no_eos": float((last != 2).double().mean()), "iw": float(w.double().mean())}
seconds = time.perf_counter() - t0
out.update(seconds=seconds, peak_growth_mb=(peak_kb() - before) / 1024)
print(json.dumps(out))
"""


def run(mode: str, path: Path, cold: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, mode, str(path), "1" if cold else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout)


def benchmark_dump(
    keep: str | None, gb: float
) -> tuple[Path, tempfile.TemporaryDirectory[str] | None]:
    """The benchmark's `step_000001.pt` of about `gb` GB in AReaL's layout: in `keep` (made
    once, reused by later runs) or in a temporary directory (returned, for cleanup)."""
    from tests.support.fixtures import batch_dumps as bf

    tmp = None if keep else tempfile.TemporaryDirectory(prefix="bench-batches-")
    directory = Path(keep or tmp.name)  # type: ignore[union-attr]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "step_000001.pt"
    if not path.exists():
        t0 = time.perf_counter()
        bf.write_large_trajectory(path, int(gb * (1 << 30)), width=8192)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())  # clean pages can be evicted for the cold runs
        print(
            f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f}s"
        )
    return path, tmp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="dump size in GB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the dump here and keep it")
    args = parser.parse_args()

    path, tmp = benchmark_dump(args.keep, args.gb)
    size_mb = path.stat().st_size / (1 << 20)
    print(
        f"cpu cores: {os.cpu_count()}, file {size_mb:.0f} MiB, repeat {args.repeat}, "
        "median of fresh processes"
    )
    modes = ("summary", "naive", "sample")
    runs: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for cold in (False, True):
        # Interleaved (summary, naive, sample, summary, ...) so that load from other
        # processes on a shared machine hits both sides of each ratio alike.
        for _ in range(args.repeat):
            for mode in modes:
                runs.setdefault((mode, cold), []).append(run(mode, path, cold))
    print(f"\n{'cache':<6} {'measure':<8} {'min s':>8} {'median s':>9} {'peak MB':>9}")
    for (mode, cold), rs in runs.items():
        secs = [r["seconds"] for r in rs]
        print(
            f"{'cold' if cold else 'warm':<6} {mode:<8} {min(secs):>8.3f} "
            f"{statistics.median(secs):>9.3f} "
            f"{statistics.median(r['peak_growth_mb'] for r in rs):>9.0f}"
        )
    for cold in (False, True):
        s_runs, n_runs = runs[("summary", cold)], runs[("naive", cold)]
        best = min(r["seconds"] for r in n_runs) / min(r["seconds"] for r in s_runs)
        med = statistics.median(r["seconds"] for r in n_runs) / statistics.median(
            r["seconds"] for r in s_runs
        )
        mem = statistics.median(r["peak_growth_mb"] for r in s_runs) / max(
            statistics.median(r["peak_growth_mb"] for r in n_runs), 1
        )
        print(
            f"{'cold' if cold else 'warm'}: naive/summary time {best:.1f}x (min), "
            f"{med:.1f}x (median); summary peak memory {mem:.0%} of naive"
        )
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
