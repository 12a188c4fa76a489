"""How we start Python: every interpreter command the console and the agent run is built
here (the console imports this module; the node package cannot import the console).

A Python started with `-c CODE` or `-m MODULE` puts the working directory first on
`sys.path`, and a script's folder for `python SCRIPT`: a `hashlib.py`, `torch/` or
`sitecustomize.py` another user left there would run with our rights. So:

- Our own code, which needs nothing but the standard library and what it puts on
  `sys.path` itself (the agent bootstrap, the job supervisor): `python -I` (isolated: no
  working directory, no PYTHON* variables, no user site; Python 3.4 and later, and the
  agent needs 3.9 anyway: an older interpreter refuses the option, which the bootstrap's
  caller reports as too old).
- Code that runs in the user's environment (the reference trainer, its
  `torch.distributed.run` relaunch and ranks, a replay, the torch check): `-I` would drop
  what that environment needs (torch found through PYTHONPATH, e.g. an HPC module, or the
  user's site-packages), and `-P`, which drops only the working directory, is Python 3.11
  and later. So such code runs as `-c` with a first line that removes the working
  directory's entry before anything is imported (`-m MODULE` becomes `runpy` under that
  line), and `clean_env` drops the empty and relative PYTHONPATH entries (each of those
  means a folder relative to the working directory).
- Every such process also starts in a folder we own (the run's private folder; a Slurm
  step with `--chdir`), so that even an interpreter we did not start this way (one a
  user's template names) finds nothing planted there.

`python SCRIPT` is used only for a script in a folder of ours (the staged trainer
payload). Standard library only; Python 3.9 reads this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

# Our own code: isolated mode.
ISOLATED = ("-I",)
# Run before anything else in user-environment code: `-c` put "" (the working directory)
# first on sys.path; Python 3.11's -P would leave it out.
DROP_WORKING_DIR = "import sys\nif sys.path and sys.path[0] in ('', '.'):del sys.path[0]\n"


def isolated(python: str, code: str, *args: str) -> list[str]:
    """`python -I -c CODE ARGS`: our own standard-library code."""
    return [python, *ISOLATED, "-c", code, *args]


def user_code(python: str, code: str, *args: str, flags: Sequence[str] = ()) -> list[str]:
    """`python -c CODE ARGS` in the user's environment, the working directory off sys.path."""
    return [python, *flags, "-c", DROP_WORKING_DIR + code, *args]


def _run_module_code(module: str) -> str:
    return f"import runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"


def user_module(python: str, module: str, *args: str, flags: Sequence[str] = ()) -> list[str]:
    """`python -m MODULE ARGS` as `user_code`: runpy runs the module as `__main__` (its
    sys.argv[0] its file, as `-m` sets it)."""
    return user_code(python, _run_module_code(module), *args, flags=flags)


_MODULE_CODE_HEAD = DROP_WORKING_DIR + "import runpy\nrunpy.run_module('"


def as_module_argv(argv: list[str]) -> list[str]:
    """A command line with each `-c CODE` that `user_module` wrote shown as the `-m MODULE`
    it stands for: how the agent shows and classifies our trainer, its torchrun and its
    ranks (`python -u -m areal_node.trainer ...`, not the code). Anything else unchanged."""
    if not any(a.startswith(_MODULE_CODE_HEAD) for a in argv):
        return argv
    out: list[str] = []
    i = 0
    while i < len(argv):
        code = argv[i + 1] if argv[i] == "-c" and i + 1 < len(argv) else ""
        module = code[len(_MODULE_CODE_HEAD) :].partition("'")[0]
        if (
            code.startswith(_MODULE_CODE_HEAD)
            and module.replace(".", "").replace("_", "").isalnum()
            and code == DROP_WORKING_DIR + _run_module_code(module)
        ):
            out += ["-m", module]
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def clean_pythonpath(value: str) -> str:
    """PYTHONPATH without its empty and relative entries (the working directory's)."""
    return os.pathsep.join(p for p in value.split(os.pathsep) if os.path.isabs(p))


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for a user-environment interpreter: PYTHONPATH cleaned (and
    dropped when nothing is left), everything else as it is."""
    out = dict(env)
    if "PYTHONPATH" in out:
        cleaned = clean_pythonpath(out["PYTHONPATH"])
        if cleaned:
            out["PYTHONPATH"] = cleaned
        else:
            del out["PYTHONPATH"]
    return out
