"""Import contracts (the role import-linter plays in Harlequin), on the static import graph
of the console and the node package: no cycles, and layers that point one way:

    app, palette, cli, commands  ->  screens  ->  widgets  ->  core  ->  areal_node

Deferred imports inside functions count (they are still dependencies); imports under
`if TYPE_CHECKING:` do not (they never run). The node package runs on nodes: it imports
nothing of the console, only the standard library outside the modules named below, and
Python 3.9 reads it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"areal_console": ROOT / "tui" / "areal_console", "areal_node": ROOT / "agents" / "areal_node"}  # fmt: skip


def module_name(package_dir: Path, path: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(base, path): path for base in PACKAGES.values() for path in base.rglob("*.py")
    }


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """Modules of this project that `module` imports at run time."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import (this project imports absolutely)"
            base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name in known and name != module}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(edges: dict[str, set[str]], source: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} -> {t}" for m, targets in edges.items() if under(m, source) for t in targets
        if under(t, *forbidden)
    )  # fmt: skip


UI = ("areal_console.app", "areal_console.palette", "areal_console.cli", "areal_console.commands")


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "areal_console.screens.runs" in edges["areal_console.app"]
    assert "areal_console.core.connection.fleet" in edges["areal_console.core.connection.monitor"]
    assert "areal_node.batches" in edges["areal_console.core.batches.source"]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers_point_one_way() -> None:
    edges = graph()
    screens, widgets = "areal_console.screens", "areal_console.widgets"
    assert violations(edges, "areal_node", ("areal_console",)) == []
    core_may_not = (screens, widgets, "areal_console.workers", "areal_console.messages", *UI)
    assert violations(edges, "areal_console.core", core_may_not) == []
    assert violations(edges, widgets, (screens, *UI)) == []
    assert violations(edges, screens, UI) == []
    shared_modules = ("workers", "messages", "navigation", "toast")
    for shared in (f"areal_console.{name}" for name in shared_modules):
        assert violations(edges, shared, (screens, widgets, *UI)) == [], shared


def test_core_source_never_names_textual() -> None:
    core = PACKAGES["areal_console"] / "core"
    offenders = []
    for path in core.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "textual"]  # fmt: skip
    assert offenders == []


def test_every_project_import_names_an_existing_module() -> None:
    """A module moved or renamed leaves no import of its old name behind (deferred ones
    included, which only fail when their function first runs)."""
    found = modules()
    missing = []
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in PACKAGES and target not in found:
                    missing.append(f"{name}: {target}")
    assert missing == []


# Node modules that import more than the standard library, and what. Only the trainer's
# modules import torch when they load; the others import it (or an optional library whose
# absence they report) inside the functions that use it, so the agent and the batch reader
# load on a node without them.
NODE_BEYOND_STDLIB = {
    "areal_node.agent.gpus": {"pynvml"},
    "areal_node.batches.analysis": {"torch"},
    "areal_node.batches.eos": {"tokenizers", "transformers"},
    "areal_node.batches.loader": {"torch"},
    "areal_node.fr_hook.sitecustomize": {"torch"},
    "areal_node.trainer.areal_log": {"torch"},
    "areal_node.trainer.model": {"torch"},
    "areal_node.trainer.rollout": {"torch"},
    "areal_node.trainer.run": {"torch"},
    "areal_node.trainer.step": {"torch"},
}
TORCH_WHEN_LOADED = {
    "areal_node.trainer.model",
    "areal_node.trainer.rollout",
    "areal_node.trainer.run",
    "areal_node.trainer.step",
}


def beyond_stdlib(tree: ast.AST, nodes: list[ast.stmt] | None = None) -> set[str]:
    """Top-level names of what the statements import that is neither the standard library
    nor this project (every statement of `tree`, or only `nodes`)."""
    found: set[str] = set()
    for node in ast.walk(tree) if nodes is None else nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    project = set(PACKAGES) | {"__future__"}
    return {name for name in found if name not in sys.stdlib_module_names | project}


def node_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items() if under(name, "areal_node")}


def test_the_node_package_imports_nothing_of_the_console() -> None:
    """Not even for type checking: the console is not installed on a node."""
    offenders = []
    for name, path in node_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
            else:
                continue
            offenders += [f"{name}: {t}" for t in targets if under(t, "areal_console")]
    assert offenders == []
    assert len(node_modules()) > 20  # the package is there


def test_the_node_package_needs_only_the_stdlib_outside_named_modules() -> None:
    found = {}
    for name, path in node_modules().items():
        extra = beyond_stdlib(ast.parse(path.read_text()))
        if extra:
            found[name] = extra
    assert found == NODE_BEYOND_STDLIB


def test_only_the_trainer_imports_torch_when_it_loads() -> None:
    at_load = {
        name
        for name, path in node_modules().items()
        if beyond_stdlib(tree := ast.parse(path.read_text()), tree.body)
    }
    assert at_load == TORCH_WHEN_LOADED


def test_python_3_9_reads_the_node_package() -> None:
    for name, path in node_modules().items():
        ast.parse(path.read_text(), filename=name, feature_version=(3, 9))


def loaded_by(*argv: str) -> set[str]:
    """The modules a real `areal-console ARGV` process has loaded when it exits."""
    import subprocess

    from tests.conftest import cli_env

    script = (
        "import sys; from areal_console.cli import main; code = main(sys.argv[1:]); "
        "sys.stdout.flush(); print('\\n'.join(sorted(sys.modules)), file=sys.stderr); "
        "raise SystemExit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True, text=True, timeout=120, env=cli_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return set(done.stderr.split())


def test_version_loads_no_command() -> None:
    """`--version` answers before any command's module is imported: no settings file
    reader, no report bundle, no parser of every command (a contract, not a timing)."""
    loaded = loaded_by("--version")
    assert "areal_console.cli" in loaded
    for module in (
        "areal_console.core.common.settings",
        "areal_console.core.report.bundle",
        "areal_console.commands.stacks",
        "areal_console.commands.tui",
        "yaml",
        "textual",
    ):
        assert module not in loaded, module


def test_listing_saved_captures_reads_no_capture_code() -> None:
    """`stacks --list` lists from the index: no codec (reading a capture back), no YAML, no
    rollout context, no TUI."""
    loaded = loaded_by("stacks", "--list")
    assert "areal_console.core.stacks.store" in loaded
    for module in (
        "areal_console.core.stacks.codec",
        "areal_console.core.rollout.context",
        "yaml",
        "textual",
    ):
        assert module not in loaded, module
