"""What a command line says: Python or not, `-m` module, flag values, wrappers, agents."""

from __future__ import annotations

import os

# Programs that only wrap a worker: LocalScheduler runs each one as `/bin/bash -c "ENV
# stdbuf -oL python3 -m ... 2>&1 | tee -a LOG >(stdbuf -oL sed ... >> merged.log)"`
# (areal/infra/utils/proc.py:26-121).
WRAPPER_EXES = frozenset(
    {"bash", "sh", "dash", "zsh", "stdbuf", "tee", "sed", "env", "nohup", "setsid", "timeout"}
    | {"singularity", "apptainer"}  # Slurm tasks: `singularity exec ... IMAGE bash -c ...`
)


def is_python(cmdline: list[str], comm: str) -> bool:
    exe = os.path.basename(cmdline[0]) if cmdline else comm
    return (
        exe.startswith("python")
        or comm.startswith("python")
        or comm in ("pt_main_thread", "torchrun")
    )


def flag_value(cmdline: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` on a command line (the last one wins)."""
    found = None
    for i, arg in enumerate(cmdline):
        if arg == name and i + 1 < len(cmdline):
            found = cmdline[i + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def flag_values(cmdline: list[str]) -> dict[str, str]:
    """Every `--name V` and `--name=V` of a command line, by name (the last one wins): what
    `flag_value` gives for each name, in one pass."""
    found: dict[str, str] = {}
    last = len(cmdline) - 1
    for i, arg in enumerate(cmdline):
        if not arg.startswith("-"):
            continue
        if "=" in arg:
            name, value = arg.split("=", 1)
            found[name] = value
        elif i < last:
            found[arg] = cmdline[i + 1]
    return found


def python_module(cmdline: list[str]) -> str | None:
    """The module a Python command line runs with `-m` (None: a script or not Python)."""
    for i, arg in enumerate(cmdline[1:], start=1):
        if arg == "-m" and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg == "-c" or not arg.startswith("-"):
            return None
    return None


def exe_name(cmdline: list[str]) -> str:
    return os.path.basename(cmdline[0]) if cmdline else ""


def is_agent(cmdline: list[str]) -> bool:
    """An areal-console agent (ours or another user's): never part of a job."""
    return len(cmdline) > 2 and cmdline[1] == "-c" and "areal-console" in cmdline[2]


def is_wrapper_exe(cmdline: list[str]) -> bool:
    return exe_name(cmdline) in WRAPPER_EXES
