"""Import rules: the core never imports Textual; the agent is standard library only."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import areal_console.core as core
import areal_node.agent
from conftest import cli_env


def test_core_imports_no_textual() -> None:
    modules = [m.name for m in pkgutil.walk_packages(core.__path__, "areal_console.core.")]
    assert "areal_console.core.connection.fleet" in modules
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


# What a one-shot `stacks --local` capture has no use for: each costs milliseconds of every
# start (numpy, reached once through the metrics follower, was 80 ms of a 180 ms capture).
NOT_FOR_A_CAPTURE = (
    "textual",
    "rich",
    "numpy",
    "torch",
    "concurrent.futures",
    "logging",
    "areal_console.core.metrics.health",
    "areal_console.core.metrics.follow",
    "areal_node.server_poll",
)


def test_a_local_capture_imports_only_what_it_uses(tmp_path: Path) -> None:
    """A real `stacks --local --json` of a process with rank variables, then the modules
    it loaded (the command's whole import path, deferred imports included)."""
    from tests.support.fixtures.hang import free_port

    port = str(free_port())
    rank_env = dict(cli_env(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_PORT=port)
    rank_env["MASTER_ADDR"] = "127.0.0.1"
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=rank_env)
    code = (
        "import json, sys\n"
        "from areal_console.cli import main\n"
        f"code = main(['stacks', '--local', '--json', '--job', '127.0.0.1:{port}'])\n"
        "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}), file=sys.stderr)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env=cli_env(AREAL_CONSOLE_DATA_DIR=str(tmp_path)),
            check=False,
        )
    finally:
        rank.kill()
        rank.wait()
    loaded = json.loads(out.stderr.strip().splitlines()[-1])
    assert loaded["code"] == 0, out.stderr
    ranks = json.loads(out.stdout)["ranks"]
    assert [(r["pid"], r["state"]) for r in ranks] == [(rank.pid, "ok")]  # it really captured
    modules = set(loaded["modules"])
    assert {"areal_console.core.stacks.capture", "areal_node.agent.pyspy"} <= modules
    assert sorted(m for m in modules for n in NOT_FOR_A_CAPTURE
                  if m == n or m.startswith(n + ".")) == []  # fmt: skip


def test_agent_module_level_imports_are_stdlib_only() -> None:
    modules = sorted(Path(areal_node.agent.__file__).parent.glob("*.py"))
    assert len(modules) > 10, modules
    top_level: set[str] = set()
    for module in modules:
        tree = ast.parse(module.read_text())
        for node in tree.body:  # module level only; optional imports live inside functions
            if isinstance(node, ast.Import):
                top_level.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top_level.add(node.module.split(".")[0])
    assert {"json", "areal_node"} <= top_level, "the check would be vacuous"
    # The node package's own modules and the standard library, nothing else.
    assert top_level <= set(sys.stdlib_module_names) | {"__future__", "areal_node"}, top_level


def test_one_class_per_name_in_the_console() -> None:
    """One word per concept: no two classes of the console package share a name (there
    were two unrelated `Reply`s: a worker's message and the agent client's future)."""
    where: dict[str, list[str]] = {}
    package = Path(core.__file__).parent.parent
    for module in sorted(package.rglob("*.py")):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(module.relative_to(package)))
    assert {"Reply", "PendingReply", "StackCapture"} <= where.keys(), "the check would be vacuous"
    assert {name: at for name, at in where.items() if len(at) > 1} == {}


def test_no_core_dump_is_tracked() -> None:
    """A crashed daemon's core file once slipped into a commit; .gitignore keeps them out."""
    root = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, check=True
    ).stdout.split("\0")
    assert "tui/areal_console/app.py" in tracked
    dumps = []
    for name in filter(None, tracked):
        path = root / name
        if not path.is_file():
            continue
        with path.open("rb") as fh:
            head = fh.read(18)
        # ELF magic, then e_type (bytes 16-17, little-endian) 4 = ET_CORE.
        if head[:4] == b"\x7fELF" and head[16:18] == b"\x04\x00":
            dumps.append(name)
    assert dumps == []
    ignored = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "-q", "--no-index", "tests/core"], check=False
    )
    assert ignored.returncode == 0, "core files must be ignored"


def test_installed_package_holds_no_test_code() -> None:
    """Scenarios and dump writers live under tests/; the shipped package never imports them."""
    package = Path(core.__path__[0]).parent
    offenders = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert (package / "app.py").exists()
    assert offenders == []
    assert not (package / "scenarios").exists()
    assert not (package / "core" / "batch_fixtures.py").exists()


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def test_recorded_fixtures_carry_no_machine_paths() -> None:
    """Recordings under tests/data name the neutral root (tests/support/fixtures/neutral_paths.py),
    not the checkout, interpreter, home or temporary directories of the machine that
    recorded them, nor of this one."""
    import pickle
    import re

    from tests.support.fixtures.neutral_paths import machine_paths

    data = Path(__file__).resolve().parents[1] / "data"
    # Where this project's machines keep checkouts, homes, interpreters and temp files,
    # and this machine's own paths.
    foreign = re.compile(
        r"(?<![\w.])(?:/work/|/root/|/home/(?!alice[/\s\"']|alice$)|/tmp/(?!run\b)"
        + "".join(f"|{re.escape(p)}(?=[/\\s\"']|$)" for p in machine_paths())
        + ")"
    )
    checked, found = 0, []
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        if raw[:1] == b"\x80":  # a pickled Flight Recorder dump (our own recording)
            texts = _strings(pickle.loads(raw))
        else:
            texts = [raw.decode()]
        checked += 1
        found += [f"{path.relative_to(data)}: {m.group(0)!r}" for t in texts
                  for m in foreign.finditer(t)]  # fmt: skip
    assert checked >= 30
    assert found == [], "\n".join(found[:20])
