"""The node agent's oldest Python, checked without old interpreters.

`MIN_PYTHON` (core/connection/transport.py) is what the bootstrap accepts. The agent's package must
need no newer Python: vermin (a tool made for this) finds the minimum version of every
construct, call and module used, and `ast.parse(feature_version=...)` parses every file
with that version's grammar. The bootstrap, which must run on an older python3 to say it is
too old, is checked the same way against 3.6. test_hostile_inputs.py runs the agent on
real 3.8 and 3.9 interpreters (.ci/run installs them with uv).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from areal_console.core.connection.transport import MIN_PYTHON

NODE_PACKAGE = Path(__file__).resolve().parents[2] / "agents" / "areal_node"
TARGET = ".".join(map(str, MIN_PYTHON))


def vermin(*paths: Path) -> subprocess.CompletedProcess[str]:
    # `-t=3.9-`: fail on anything that needs more than 3.9; annotations are not evaluated
    # at run time under `from __future__ import annotations` and are not counted.
    return subprocess.run(
        [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())",
         f"-t={TARGET}-", "--violations", "--no-tips", "--no-eval-annotations",
         *map(str, paths)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def node_files() -> list[Path]:
    files = sorted(NODE_PACKAGE.rglob("*.py"))
    assert NODE_PACKAGE / "agent" / "serve.py" in files
    return files


def test_the_node_package_needs_no_newer_python_than_the_minimum() -> None:
    result = vermin(*node_files())
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"Minimum required versions: (?:2\.\d+, )?3\.(\d+)", result.stdout)
    assert found, result.stdout
    assert (3, int(found.group(1))) <= MIN_PYTHON


@pytest.mark.parametrize(
    "newer",
    [
        "def f(x):\n    match x:\n        case 1:\n            return 1\n",  # 3.10 syntax
        "import sys\nprint(list(zip([1], [2], strict=True)))\n",  # 3.10 keyword
        "import tomllib\n",  # 3.11 module
        "from itertools import pairwise\n",  # 3.10 function
    ],
)
def test_the_check_fails_on_code_newer_than_the_minimum(tmp_path: Path, newer: str) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(newer)
    result = vermin(probe)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"Target versions not met:   {TARGET}-" in result.stdout


def test_every_node_file_parses_with_the_minimums_grammar() -> None:
    for path in node_files():
        ast.parse(path.read_text(), str(path), feature_version=MIN_PYTHON)
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=MIN_PYTHON)


def test_the_bootstrap_runs_on_python_3_6_to_say_it_is_too_old(tmp_path: Path) -> None:
    """A node whose python3 is 3.6 (CentOS 7) hears that the agent needs MIN_PYTHON: the
    bootstrap itself needs no newer Python than 3.6 to get that far."""
    from areal_console.core.connection.transport import BOOTSTRAP, SHARED_BOOTSTRAP

    for name, source in (("bootstrap.py", BOOTSTRAP), ("shared_bootstrap.py", SHARED_BOOTSTRAP)):
        path = tmp_path / name
        path.write_text(source)
        result = subprocess.run(
            [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())",
             "-t=3.6-", "--violations", "--no-tips", str(path)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        ast.parse(source, name, feature_version=(3, 6))
