"""Where we write: every folder and file the console and the node agent create goes through
`areal_node.private_files` (the console through `core/common/private_files.py`), which
makes folders 0700 with `mkdir`, files `O_CREAT|O_EXCL|O_NOFOLLOW`, and checks that no
other user can change the folders above (docs/design/security.md, "Where we write").

An AST scan, like the import contracts: a module that opens a file for writing, creates a
folder or a temporary file, or renames, links or copies files itself fails here, whatever
the path (the scan cannot tell a private path from a dump's, so it allows neither).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "tui" / "areal_console", ROOT / "agents" / "areal_node")

# The helper itself, and what cannot import it (each already writes by the same rule).
ALLOWED = {
    "agents/areal_node/private_files.py": "the helper",
    "tui/areal_console/core/common/private_files.py": "the helper's console face",
    # Loaded as `sitecustomize` into a job's interpreter from its own folder, before the
    # package is importable: makes its socket folder 0700 itself and its dump files
    # O_EXCL|O_NOFOLLOW then renamed into place.
    "agents/areal_node/fr_hook/sitecustomize.py": "runs inside the job, package-less",
    # Shipped to Ray nodes by value, with nothing of the package installed there: writes
    # the payload into a fresh mkdtemp folder with O_EXCL|O_NOFOLLOW.
    "agents/areal_node/ray_host.py": "shipped by value to Ray nodes",
}
# The reference trainer is the job, not the console: it writes its output_dir, logs and
# dump where its command line says, as AReaL's trainer does (a replay points them into
# the run's private folder).
ALLOWED_FOLDERS = ("agents/areal_node/trainer/",)

# Calls that create, replace or move files or folders, whatever their receiver.
CREATING_CALLS = {
    "write_text", "write_bytes", "mkdir", "makedirs", "mkdtemp", "mkstemp", "mktemp",
    "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile", "TemporaryDirectory",
    "touch", "replace", "rename", "renames", "symlink", "symlink_to", "link", "hardlink_to",
    "mkfifo", "mknod", "copy", "copy2", "copyfile", "copytree", "move",
}  # fmt: skip
WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_APPEND", "O_TRUNC"}
READ_MODES = set("rbt")


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _mode(call: ast.Call) -> ast.expr | None:
    """The mode of an `open` call: `open(path, mode)`, `io.open(path, mode)`, or a path
    object's `p.open(mode)`."""
    for kw in call.keywords:
        if kw.arg == "mode":
            return kw.value
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    on_path = receiver is not None and not (
        isinstance(receiver, ast.Name) and receiver.id in {"io", "codecs", "gzip", "bz2", "lzma"}
    )
    index = 0 if on_path else 1
    return call.args[index] if len(call.args) > index else None


def violations(source: str) -> list[tuple[int, str]]:
    """(line, what) for each write this module makes outside the helper."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        if name == "open" and not (isinstance(receiver, ast.Name) and receiver.id == "os"):
            if any(kw.arg == "fileobj" for kw in node.keywords):
                continue  # an archive built in memory (tarfile.open(fileobj=BytesIO))
            mode = _mode(node)
            literal = isinstance(mode, ast.Constant) and isinstance(mode.value, str)
            if mode is None or (literal and set(str(mode.value)) <= READ_MODES):  # type: ignore[union-attr]
                continue
            found.append((node.lineno, f"open(..., {ast.unparse(mode)})"))
        elif name == "open":  # os.open: any write flag
            flags = {
                n.attr
                for arg in node.args[1:2]
                for n in ast.walk(arg)
                if isinstance(n, ast.Attribute)
            }
            if flags & WRITE_FLAGS:
                found.append((node.lineno, f"os.open(..., {ast.unparse(node.args[1])})"))
        elif name in CREATING_CALLS:
            if name in {"replace", "copy"} and not (
                isinstance(receiver, ast.Name) and receiver.id in {"os", "shutil"}
            ):
                continue  # str.replace, dict.copy, dataclasses.replace, ...
            if name == "link" and not (isinstance(receiver, ast.Name) and receiver.id == "os"):
                continue
            found.append((node.lineno, f"{ast.unparse(node.func)}(...)"))
    return found


def _modules() -> list[tuple[str, Path]]:
    return [
        (str(path.relative_to(ROOT)), path)
        for base in PACKAGES
        for path in sorted(base.rglob("*.py"))
    ]


def test_every_write_goes_through_the_helper() -> None:
    bad = []
    for rel, path in _modules():
        if rel in ALLOWED or rel.startswith(ALLOWED_FOLDERS):
            continue
        bad += [f"{rel}:{line}: {what}" for line, what in violations(path.read_text())]
    assert not bad, "writes outside private_files:\n" + "\n".join(bad)


def test_the_allowlist_names_files_that_exist() -> None:
    """A file that moved or went must leave the list (or the exemption hides nothing)."""
    assert all((ROOT / rel).is_file() for rel in ALLOWED)
    assert all((ROOT / folder).is_dir() for folder in ALLOWED_FOLDERS)


def test_the_scan_sees_each_kind_of_write() -> None:
    """The scan itself: each way of writing is caught, reads and look-alikes are not."""
    caught = [
        "open(p, 'w')", "open(p, mode='ab')", "open(p, 'x')", "open(p, 'r+')", "open(p, m)",
        "Path(p).open('w')", "p.write_text('x')", "p.write_bytes(b'')", "p.mkdir()",
        "os.makedirs(p)", "tempfile.mkdtemp()", "tempfile.mkstemp()", "p.touch()",
        "os.replace(a, b)", "os.rename(a, b)", "os.symlink(a, b)", "shutil.copy(a, b)",
        "shutil.move(a, b)", "os.open(p, os.O_WRONLY | os.O_CREAT)", "os.open(p, os.O_RDWR)",
        "tempfile.NamedTemporaryFile()", "os.mkfifo(p)",
    ]  # fmt: skip
    for code in caught:
        assert violations(code), code
    allowed = [
        "open(p)", "open(p, 'rb')", "open(p, mode='r')", "os.open(p, os.O_RDONLY | os.O_NOFOLLOW)",
        "s.replace('a', 'b')", "d.copy()", "tarfile.open(fileobj=buf, mode='w:gz')",
        "os.fdopen(fd, 'wb')", "dataclasses.replace(x, a=1)",
    ]  # fmt: skip
    for code in allowed:
        assert not violations(code), code
