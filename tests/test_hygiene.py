"""Import rules: the core never imports Textual; the agent is standard library only."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys

import areal_console.core as core
from areal_agent import AGENT_PATH
from conftest import cli_env


def test_core_imports_no_textual() -> None:
    modules = [m.name for m in pkgutil.walk_packages(core.__path__, "areal_console.core.")]
    assert "areal_console.core.fleet" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=cli_env()
    )
    assert out.stdout.strip() == "[]"


def test_agent_module_level_imports_are_stdlib_only() -> None:
    tree = ast.parse(AGENT_PATH.read_text())
    top_level: set[str] = set()
    for node in tree.body:  # module level only; optional imports live inside functions
        if isinstance(node, ast.Import):
            top_level.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top_level.add(node.module.split(".")[0])
    assert top_level, "no imports found: the check would be vacuous"
    assert top_level <= set(sys.stdlib_module_names) | {"__future__"}, top_level
