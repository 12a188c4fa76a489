"""README's command synopsis names the `stacks` options a new user needs: two jobs on one
node make `stacks` refuse until `--job` or `--all-jobs` is given."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from areal_console.cli import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
# Options left to `--help`: tuning and the saved-capture subcommands' extras.
HELP_ONLY = {"--help", "--timeout", "--nonblocking", "--all-users"}


def commands_block() -> str:
    return README.read_text().split("## Commands", 1)[1].split("```")[1]


def synopsis(command: str) -> str:
    lines = commands_block().splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith(f"areal-console {command} "):
            out.append(line)
            out += [cont for cont in lines[i + 1 :] if cont.startswith(" ")][:3]
    return "\n".join(out)


def test_the_stacks_synopsis_names_every_option_but_tuning() -> None:
    parser = build_parser("stacks")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    stacks = sub.choices["stacks"]
    options = {o for a in stacks._actions for o in a.option_strings if o.startswith("--")}
    shown = set(re.findall(r"--[a-z][a-z0-9-]*", commands_block()))  # TARGETS' options too
    missing = sorted(options - shown - HELP_ONLY)
    assert not missing, f"README's synopsis lacks {missing}"
    assert "[--job KEY | --all-jobs]" in synopsis("stacks")
