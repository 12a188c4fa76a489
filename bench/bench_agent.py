"""Agent cost while streaming samples at 1 Hz on a node with ~200 processes, and round trips.

    python bench/bench_agent.py [--seconds 30] [--extra-procs 200]
    python bench/bench_agent.py --start-only --baseline OTHER_CHECKOUT [--repeat 15]

Measures, in one run:
- the agent's CPU (utime+stime from /proc) and RSS while it streams one sample a second,
  against a baseline of what a hand-rolled monitor does: `ps -eo pid,ppid,stat,pcpu,rss,args`
  once a second (ps's own CPU, measured the same way);
- the round trip of a `sample` request and of a `ping` over the local pipe, against spawning
  `ps` once (the baseline cost of asking the system the same question from outside);
- the agent's cold start: from the console asking for an agent on this machine (the
  bootstrap, the payload built and checked, the interpreter, the agent's imports) to its
  `hello` reply, with the node's cache empty (the payload is sent) and with it filled, the
  first `sample` after it (with its 0.2 s CPU% baseline) and the median of 20 more. With `--baseline`, the same in the same run for another
  checkout of the console (its `tui/` and its agent's directory), interleaved run by run.
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

ROOT = Path(__file__).resolve().parent.parent

from areal_console.core.connection.client import AgentClient  # noqa: E402
from areal_console.core.connection.transport import LocalChannel  # noqa: E402

TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


def rss_mb(pid: int) -> float:
    return (
        int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    )


def count_processes() -> int:
    return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit())


# Run in a fresh interpreter of the checkout under test (its code on PYTHONPATH): the
# console's imports come first (not timed), then one agent start, timed.
START_PROBE = """
import json, sys, time
from areal_console.core.connection.client import AgentClient
from areal_console.core.connection.transport import LocalChannel
t0 = time.perf_counter()
client = AgentClient(LocalChannel())
client.start()
t1 = time.perf_counter()
client.request("sample", {"all": False})
t2 = time.perf_counter()
rounds = []
for _ in range(20):
    t3 = time.perf_counter()
    client.request("sample", {"all": False})
    rounds.append(time.perf_counter() - t3)
client.close()
print(json.dumps({"hello": t1 - t0, "first_sample": t2 - t1, "sample": sorted(rounds)[10]}))
"""


def checkout_path(root: Path) -> str:
    """PYTHONPATH for a checkout: its console and its agent package's parent."""
    agent_dir = root / "agents"
    return os.pathsep.join([str(root / "tui"), str(agent_dir)])


def start_once(root: Path, cache: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=checkout_path(root), XDG_CACHE_HOME=cache)
    out = subprocess.run(
        [sys.executable, "-c", START_PROBE], capture_output=True, text=True, env=env, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return result


def bench_start(trees: dict[str, Path], repeat: int) -> None:
    """Cold start of the agent, cache empty and filled, checkouts interleaved run by run."""
    times: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        for name, root in trees.items():
            start_once(root, os.path.join(tmp, f"warm-{name}"))  # fill the cache, warm pages
        for i in range(repeat):
            for name, root in trees.items():
                empty = os.path.join(tmp, f"empty-{name}-{i}")
                times.setdefault((name, "miss"), []).append(start_once(root, empty))
                warm = os.path.join(tmp, f"warm-{name}")
                times.setdefault((name, "hit"), []).append(start_once(root, warm))
    med = statistics.median
    print(
        f"agent cold start to hello (median of {repeat}, interleaved; {count_processes()} "
        f"processes; load {os.getloadavg()[0]:.1f})"
    )
    for cache in ("hit", "miss"):
        for name in trees:
            runs = times[(name, cache)]
            print(
                f"  {name:<9} cache {cache:<4}  hello {med(r['hello'] for r in runs) * 1000:6.1f} ms"
                f"  first sample {med(r['first_sample'] for r in runs) * 1000:6.1f} ms"
                f"  then sample {med(r['sample'] for r in runs) * 1000:5.1f} ms"
            )
        if len(trees) == 2:
            this, base = (times[(n, cache)] for n in trees)
            ratio = med(r["hello"] for r in this) / med(r["hello"] for r in base)
            print(f"  ratio this/baseline, cache {cache}: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--extra-procs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15, help="cold starts per checkout")
    parser.add_argument("--baseline", type=Path, help="another checkout to compare starts with")
    parser.add_argument("--start-only", action="store_true", help="only the cold start")
    args = parser.parse_args()
    trees = {"this": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()

    # Pad the node to about 200 processes with idle ones (each with an environ to read).
    fillers = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.extra_procs)]
    try:
        bench_start(trees, args.repeat)
        if args.start_only:
            return
        n_procs = count_processes()
        channel = LocalChannel()
        client = AgentClient(channel)
        client.start()
        client.request("sample", {"all": True})  # warm: the /proc cache fills on first sight

        # Round trips.
        samples = []
        for _ in range(50):
            t0 = time.perf_counter()
            client.request("sample", {"all": False})
            samples.append(time.perf_counter() - t0)
        pings = []
        for _ in range(200):
            pings.append(client.round_trip())
        ps_spawn = []
        for _ in range(20):
            t0 = time.perf_counter()
            subprocess.run(
                ["ps", "-eo", "pid,ppid,stat,pcpu,rss,args"], capture_output=True, check=True
            )
            ps_spawn.append(time.perf_counter() - t0)

        # Steady-state cost at 1 Hz.
        got = []
        client.on_event = lambda e: got.append(e) if e.get("event") == "sample" else None
        c0, t0 = cpu_seconds(channel.pid), time.monotonic()
        client.request("stream", {"interval": 1.0})
        time.sleep(args.seconds)
        agent_cpu = (cpu_seconds(channel.pid) - c0) / (time.monotonic() - t0)
        agent_rss = rss_mb(channel.pid)
        client.close()

        # Baseline: ps once a second for the same time (children's CPU from os.times()).
        before = os.times()
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            tick = time.monotonic()
            subprocess.run(
                ["ps", "-eo", "pid,ppid,stat,pcpu,rss,args"], capture_output=True, check=True
            )
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        after = os.times()
        ps_cpu = (
            (after.children_user - before.children_user)
            + (after.children_system - before.children_system)
        ) / (time.monotonic() - t0)
    finally:
        for f in fillers:
            f.kill()
        for f in fillers:
            f.wait()

    med = statistics.median
    print(
        f"processes on the node: {n_procs}; samples received at 1 Hz: {len(got)} in {args.seconds:.0f}s"
    )
    print(f"agent CPU at 1 Hz:     {agent_cpu * 100:.2f}% of one core  (bar: < 1%)")
    print(f"agent RSS:             {agent_rss:.1f} MB  (bar: < 50 MB)")
    print(f"baseline ps at 1 Hz:   {ps_cpu * 100:.2f}% of one core")
    print(
        f"ratio agent/ps CPU:    {agent_cpu / ps_cpu:.2f}"
        if ps_cpu
        else "ratio: ps used no measurable CPU"
    )
    print(
        f"sample round trip:     median {med(samples) * 1000:.1f} ms, p90 "
        f"{sorted(samples)[int(len(samples) * 0.9)] * 1000:.1f} ms  (bar: < 20 ms)"
    )
    print(f"ping round trip:       median {med(pings) * 1000:.2f} ms")
    print(
        f"baseline spawn of ps:  median {med(ps_spawn) * 1000:.1f} ms; "
        f"ratio sample/ps-spawn {med(samples) / med(ps_spawn):.2f}"
    )


if __name__ == "__main__":
    main()
