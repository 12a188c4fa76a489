"""`areal-console stacks --local --json`, whole process, against the shell loops it replaces.

    flock /tmp/areal-heavy.lock python bench/bench_capture.py --ranks 16,64 --repeat 5
    flock /tmp/areal-heavy.lock python bench/bench_capture.py --baseline OTHER_CHECKOUT
    flock /tmp/areal-heavy.lock python -m bench.bench_capture --ranks 16 --profile

For each job size, a real hung gloo job (`collective_mismatch` scenario) runs on this
machine; once its ranks are idle (the job's own start is no part of a capture), each
repeat times, interleaved so background load hits all alike:

- loop: AReaL's recipe, `for pid in ...; do py-spy dump --pid $pid; done` (sequential);
- floor: the same dumps all at once (`py-spy dump ... &` for each, then `wait`), the CPU
  floor of dumping these processes;
- console: `python -m areal_console stacks --local --json --job KEY`, the whole process
  (interpreter start, imports, agent, capture, diagnosis, save, JSON out);
- with `--baseline`, the same console command from another checkout (its `tui/` and its
  agent's directory on PYTHONPATH), right after this one's.

Plus the fixed cost: the console capturing a single Python process with rank variables
(its own job), against one `py-spy dump` of it and a bare `python -c pass`.

With `--profile`, the same console command is also run through `bench.capture_phases`
(timers around each phase of the real command) and under `python -X importtime`, and the
breakdown is printed: interpreter start, imports, agent start, process discovery, the
dumps, the Flight Recorder and rollout reads, build, merge + diagnose, the JSON document,
saving, encoding the output, and the exit.

The console runs with bytecode caching on (`PYTHONPYCACHEPREFIX` in a temp directory), as
an installed package does; this machine's shell sets PYTHONDONTWRITEBYTECODE, which would
otherwise recompile every module at every start.
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

from tests.support.fixtures.hang import free_port, start_scenario  # noqa: E402


def checkout_path(root: Path) -> str:
    """PYTHONPATH for a checkout: its console and its agent package's parent."""
    agent_dir = root / "agents"
    return os.pathsep.join([str(root / "tui"), str(agent_dir)])


def console_env(pycache: str, root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    env["PYTHONPATH"] = checkout_path(root)
    env.setdefault("AREAL_CONSOLE_DATA_DIR", os.path.join(pycache, "data"))
    return env


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed ({out.returncode}): {out.stderr[-500:]}")
    return elapsed, out.stdout


def job_port(pid: int) -> str:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)
    return env[b"MASTER_PORT"].decode()


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU the processes have used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def settle(pids: list[int], limit: float = 120.0) -> float:
    """Wait until the job is idle (its ranks use under 2% of a core each, in a second; a
    hung gloo rank polls at about 0.5%): a job that has just come up is still finishing
    its start, which is no part of a capture. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        before = cpu_seconds(pids)
        time.sleep(1.0)
        if cpu_seconds(pids) - before < 0.02 * len(pids):
            break
    return time.monotonic() - t0


def console_args(job: str) -> list[str]:
    return ["stacks", "--local", "--json", "--job", job]


def cores() -> str:
    """The core count, and the cores this process may run on where that is fewer."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    total = os.cpu_count()
    return f"{total} CPUs" + (f" ({usable} usable)" if usable and usable != total else "")


def measure(
    pids: list[int], job: str, env: dict[str, str], repeat: int, base: dict[str, str] | None
) -> dict[str, float]:
    ids = " ".join(map(str, pids))
    loop = ["bash", "-c", f"for pid in {ids}; do py-spy dump --pid $pid; done"]
    floor = ["bash", "-c", f"for pid in {ids}; do py-spy dump --pid $pid >/dev/null & done; wait"]
    console = [sys.executable, "-m", "areal_console", *console_args(job)]
    consoles = {"console": env, **({"baseline": base} if base is not None else {})}
    for console_env_ in consoles.values():
        timed(console, console_env_)  # warm the bytecode cache and the page cache
    times: dict[str, list[float]] = {"loop": [], "floor": [], **{k: [] for k in consoles}}
    for _ in range(repeat):
        t, out = timed(loop)
        assert out.count("Thread ") >= len(pids), out[-500:]
        times["loop"].append(t)
        times["floor"].append(timed(floor)[0])
        for name, console_env_ in consoles.items():
            t, out = timed(console, console_env_)
            doc = json.loads(out)
            ok = [r for r in doc["ranks"] if r["state"] == "ok"]
            assert {r["pid"] for r in ok} == set(pids), (len(ok), len(pids))
            times[name].append(t)
    return {k: statistics.median(v) for k, v in times.items()}


def baseline_line(m: dict[str, float]) -> str:
    if "baseline" not in m:
        return ""
    return (
        f"\n  baseline checkout           {m['baseline']:.3f}s  "
        f"(this / baseline {m['console'] / m['baseline']:.3f})"
    )


def bench_job(
    nproc: int,
    env: dict[str, str],
    repeat: int,
    base: dict[str, str] | None = None,
    profiled: bool = False,
) -> None:
    t0 = time.perf_counter()
    with start_scenario("collective_mismatch", nproc=nproc) as scenario:
        scenario.wait_ready(900)
        pids = scenario.rank_pids()
        started = time.perf_counter() - t0
        settled = settle(pids)
        job = f"127.0.0.1:{job_port(pids[0])}"
        m = measure(pids, job, env, repeat, base)
        profile = phase_profile(env, console_args(job), repeat) if profiled else None
    load = os.getloadavg()[0]
    print(
        f"\n{nproc} ranks (job up in {started:.0f}s, idle after {settled:.0f}s more; median of {repeat}; "
        f"{cores()}, load average {load:.1f})"
    )
    print(f"  sequential loop             {m['loop']:.3f}s  = 1.00x the loop")
    print(
        f"  all dumps at once (floor)   {m['floor']:.3f}s  = {m['floor'] / m['loop']:.2f}x the loop"
    )
    print(
        f"  areal-console stacks --json {m['console']:.3f}s  "
        f"= {m['console'] / m['loop']:.2f}x the loop, {m['console'] / m['floor']:.2f}x the floor"
        + baseline_line(m)
    )
    if profile is not None:
        print_profile(profile)


def bench_fixed(
    env: dict[str, str], repeat: int, base: dict[str, str] | None = None, profiled: bool = False
) -> None:
    """One Python process with rank variables: its own one-rank job."""
    port = str(free_port())
    proc_env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    proc_env["MASTER_PORT"] = port
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=proc_env)
    try:
        time.sleep(1.0)  # let it settle past the interpreter start
        m = measure([proc.pid], f"127.0.0.1:{port}", env, repeat, base)
        bare = statistics.median(timed([sys.executable, "-c", "pass"])[0] for _ in range(repeat))
        no_site = [sys.executable, "-S", "-c", "pass"]
        bare_s = statistics.median(timed(no_site)[0] for _ in range(repeat))
        profile = None
        if profiled:
            profile = phase_profile(env, console_args(f"127.0.0.1:{port}"), repeat)
            imports = import_profile(env, console_args(f"127.0.0.1:{port}"))
    finally:
        proc.kill()
        proc.wait()
    print(f"\nfixed cost: a capture of 1 rank (median of {repeat}; {cores()})")
    print(f"  python -c pass              {bare:.3f}s  (python -S -c pass: {bare_s:.3f}s)")
    print(f"  one py-spy dump             {m['loop']:.3f}s")
    print(f"  areal-console stacks --json {m['console']:.3f}s  (bar: 0.150s)" + baseline_line(m))
    if profile is not None:
        print_profile(profile)
        print_imports(imports)


def phase_profile(env: dict[str, str], args: list[str], repeat: int) -> dict[str, float]:
    """Median seconds of each phase of the console command, over `repeat` runs of
    `bench.capture_phases` (the real command with timers around its phases). Interpreter
    start is from the spawn to the driver's first statement; exit from `main`'s return to
    the process's end as the parent sees it."""
    driver_env = dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], str(ROOT)]))
    argv = [sys.executable, "-m", "bench.capture_phases", *args]
    runs: list[dict[str, float]] = []
    for _ in range(repeat + 1):  # the first run warms the bytecode cache
        t0 = time.monotonic()
        out = subprocess.run(argv, capture_output=True, text=True, env=driver_env, check=False)
        t1 = time.monotonic()
        if out.returncode != 0:
            raise RuntimeError(f"capture_phases failed ({out.returncode}): {out.stderr[-500:]}")
        rec = json.loads(out.stderr.strip().splitlines()[-1])
        row = {"interpreter start": rec["started"] - t0, **rec["phases"]}
        row["exit"] = t1 - rec["ended"]
        row["whole process"] = t1 - t0
        row["dumps, longest (agent)"] = max(rec["dumps"], default=0.0)
        row["dumps, sum (agent)"] = sum(rec["dumps"])
        row["modules imported in main"] = rec["imported_in_main"]
        runs.append(row)
    keys = list(dict.fromkeys(k for r in runs[1:] for k in r))
    return {k: statistics.median(r.get(k, 0.0) for r in runs[1:]) for k in keys}


# Printed after the phases, not among them: they overlap the phases or count modules.
PROFILE_NOTES = (
    "main",
    "whole process",
    "dumps, longest (agent)",
    "dumps, sum (agent)",
    "modules imported in main",
)


def print_profile(profile: dict[str, float]) -> None:
    whole = profile["whole process"]
    print("  where the console's time goes (median; exclusive seconds per phase):")
    for name, value in profile.items():
        if name not in PROFILE_NOTES:
            print(f"    {name:<32} {value * 1000:7.1f} ms  {value / whole:6.1%}")
    print(f"    {'whole process':<32} {whole * 1000:7.1f} ms")
    print(
        f"    (py-spy as the agent timed each dump: longest "
        f"{profile['dumps, longest (agent)'] * 1000:.1f} ms, sum "
        f"{profile['dumps, sum (agent)'] * 1000:.1f} ms; "
        f"{profile['modules imported in main']:.0f} modules first imported inside main)"
    )


def import_profile(env: dict[str, str], args: list[str]) -> list[tuple[str, int]]:
    """`python -X importtime` of the console command: each top-level import's cumulative
    microseconds, in the order imported."""
    argv = [sys.executable, "-X", "importtime", "-m", "areal_console", *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if not name.startswith("  ") and name.strip():  # top level: one space after |
            rows.append((name.strip(), int(cumulative)))
    return rows


def print_imports(rows: list[tuple[str, int]]) -> None:
    total = sum(us for _, us in rows)
    site = sum(us for name, us in rows if name == "site")
    project = sum(us for name, us in rows if name.split(".")[0] in ("areal_console", "areal_node"))
    print(
        f"  imports (python -X importtime, one run): {total / 1000:.1f} ms in all; site (the "
        f"interpreter's start, .pth files) {site / 1000:.1f} ms; this project's modules "
        f"{project / 1000:.1f} ms (with what they import first)"
    )
    for name, us in sorted(rows, key=lambda r: -r[1])[:12]:
        print(f"    {name:<48} {us / 1000:6.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="16,64", help="job sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout, timed interleaved")
    parser.add_argument(
        "--profile", action="store_true", help="also time each phase of the console command"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as tmp:
        env = console_env(tmp)
        base = console_env(tmp, args.baseline.resolve()) if args.baseline else None
        bench_fixed(env, args.repeat, base, args.profile)
        for n in (int(x) for x in args.ranks.split(",") if x):
            bench_job(n, env, args.repeat, base, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
