"""Regenerate (or check) the sample outputs in docs/guide/guide.md from a real demo run.

    PYTHONPATH=tui:agents python scripts/guide_samples.py           # rewrite docs/guide/guide.md
    PYTHONPATH=tui:agents python scripts/guide_samples.py --check   # exit 1 if it drifted

Each sample sits between `<!-- sample: NAME -->` and `<!-- /sample -->` in the guide. The
script starts the demo job (`--pattern collective`, 2 ranks, gloo on CPU), runs the
commands a reader would type against it, and writes their output with what changes from
run to run (capture and job ids, times, ports, this machine's name and paths) replaced by
fixed stand-ins. Run it under the test suite's lock (it starts a real gloo job).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guide" / "guide.md"
BLOCK = re.compile(
    r"(<!-- sample: (?P<name>[\w-]+) -->\n```\n)(?P<body>.*?)(```\n<!-- /sample -->)", re.S
)

# What varies between runs, and the fixed text the guide shows instead.
STAND_INS: list[tuple[str, str]] = [
    (r"\b\d{8}-\d{6}-[0-9a-f]{4}\b", "20261122-060137-55f5"),  # capture id
    (r"\breplay-\d{8}-\d{6}-[0-9a-f]{6}\b", "replay-20261122-060159-b66a45"),  # job id
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00", "2026-11-22T06:01:37+00:00"),
    (r"\blocalhost:\d+\b", "localhost:29500"),  # the job key: its rendezvous port
    (r"areal-console-demo-[\w]+", "areal-console-demo-…"),
]


def console(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")]))
    return subprocess.run([sys.executable, "-m", "areal_console", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def normalise(text: str) -> str:
    """Stand-ins for what varies; directories shortened to `…/` (only the file name and
    its line number tell the reader something)."""
    host = socket.gethostname()
    text = re.sub(rf"\b{re.escape(host)}\b", "node1", text)
    for pattern, stand_in in STAND_INS:
        text = re.sub(pattern, stand_in, text)
    return re.sub(r"(?<![\w.…])/(?:[^\s/:()'\"]+/)+(?=[^\s/:()'\"]+)", "…/", text)


def stacks_sample(match: str) -> str:
    result = console("stacks", "--local", "--match", match)
    if result.returncode != 0:
        raise SystemExit(f"stacks failed ({result.returncode}): {result.stderr}")
    return "$ areal-console stacks --match areal-console-demo\n" + result.stdout


def replay_sample(dump: Path) -> str:
    result = console("replay", str(dump), "actor.eps_clip=0.1", "--wait")
    if result.returncode != 0:
        raise SystemExit(f"replay failed ({result.returncode}): {result.stderr}")
    # What it says before it starts and once it ended (the log lines it relays while the
    # replay runs come at the pace of the machine: left out).
    said = [line for line in result.stderr.splitlines()
            if not re.match(r"replay: replay-\S+: ", line)]  # fmt: skip
    command = f"$ areal-console replay {dump} actor.eps_clip=0.1 --wait"
    return "\n".join([command, *said, *result.stdout.splitlines()]) + "\n"


def generate() -> dict[str, str]:
    """Every sample, from one demo job (the collective pattern)."""
    sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents")]
    from areal_console.core.replay.demo import new_demo

    job = new_demo("collective", 2, 3)
    try:
        job.start()
        job.wait_ready()
        samples: dict[str, Callable[[], str]] = {
            "collective-stacks": lambda: stacks_sample(str(job.workdir)),
            "collective-replay": lambda: replay_sample(job.dump_dir),
        }
        return {name: normalise(make()) for name, make in samples.items()}
    finally:
        job.stop()
        job.remove_files()


def with_samples(guide: str, samples: dict[str, str]) -> str:
    """The guide with each marked block's body replaced by its sample."""
    missing = set(samples) - {m["name"] for m in BLOCK.finditer(guide)}
    if missing:
        raise SystemExit(f"docs/guide/guide.md has no block for: {', '.join(sorted(missing))}")
    return BLOCK.sub(lambda m: m[1] + samples.get(m["name"], m["body"]) + m[4], guide)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the guide drifted")
    args = parser.parse_args()
    guide = GUIDE.read_text()
    updated = with_samples(guide, generate())
    if args.check:
        if updated != guide:
            print("docs/guide/guide.md: samples differ from the code's output; run "
                  "scripts/guide_samples.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    GUIDE.write_text(updated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
