"""What the node reads, call by call: every file the agent opens that another user may
control goes through `areal_node.guarded_read.open_regular` (no final link followed, links
on the way only where a trusted user owns them, never blocking, a regular file only,
owned by whom the caller trusts, to a bound; docs/design/security.md, "What we read").

An AST scan of the node package, finer than `test_read_contract.py` (which lists modules
of both packages): each call of `open`, `os.open`, `read_text` or `read_bytes` must sit in
a function that ALLOWED names with what it opens. A new call anywhere else, even in a
module that already reads its own files, fails here until it goes through `open_regular`
or is listed with its reason. The second half drives `open_regular` itself with what
`nobody` plants: a FIFO, links, another user's file, a file larger than its bound.
"""

from __future__ import annotations

import ast
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_node.guarded_read import (
    LINK,
    NOT_REGULAR,
    OWNER,
    TOO_LARGE,
    Refused,
    open_regular,
)

from tests.support.nobody import as_nobody, needs_nobody, shared_tmp

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agents" / "areal_node"
OPENERS = {"open", "read_text", "read_bytes"}

# "module:function" (the innermost function or method around the call) -> what it opens.
ALLOWED = {
    "guarded_read.py:open_regular": "the guarded reader itself",
    # /proc: the kernel's files, at paths the agent builds from a pid.
    "agent/procfs.py:read_all": "/proc files (stat, cmdline, environ, net tables)",
    "agent/procfs.py:read_capped": "/proc/PID/cmdline and environ, with a bound",
    "agent/procfs.py:read_small": "/proc/PID/stat and statm",
    "agent/nccl_ras.py:loads_nccl": "/proc/PID/maps",
    "server_poll.py:tcp_tables": "/proc/PID/net/tcp and tcp6",
    "versions.py:_proc_environ": "/proc/PID/environ",
    "versions.py:process_versions": "/proc/PID/cmdline",
    "versions.py:_credentials": "/proc/PID/status",
    # The agent's own files: made by private_files in folders it checked.
    "agent/jobs.py:_read_json": "a launched job's records in the agent's job folder",
    "agent/jobs.py:tail_lines": "a launched job's log, written by the job's supervisor",
    "agent/jobs.py:op_stage_file": "a staged file in the agent's cache, checked by hash",
    "agent/relay.py:payload_frame": "the payload archive this agent itself was imported from",
    # Writes: test_write_contract.py holds them to private_files' rule.
    "private_files.py:create": "creates (O_EXCL|O_NOFOLLOW)",
    "private_files.py:_append_fd": "appends to our own file (O_NOFOLLOW, owner checked)",
    "private_files.py:replace": "creates its temporary file (O_EXCL|O_NOFOLLOW)",
    "ray_host.py:load_agent": "creates the payload in a fresh mkdtemp folder (O_EXCL)",
    # A path the user named on the command line (batch PATH and its tokenizer).
    "batches/analysis.py:ElementReader.__init__": "/proc/self/maps; a dump the user names",
    "batches/eos.py:_model_dirs_from_config": "a dump's config the user names",
    "batches/eos.py:_eos_from_config": "a tokenizer config under a dump the user names",
    "batches/loader.py:_load_pt_uncached": "a dump the user names (batch PATH)",
    "batches/summary.py:read_text_rollout": "a dump the user names (batch PATH)",
    # Runs inside a rank as the rank's user, before the package is importable.
    "fr_hook/sitecustomize.py:write_private": "creates its dump (O_EXCL|O_NOFOLLOW)",
    "fr_hook/sitecustomize.py:_is_hook_copy": "the hook's own file, inside the rank",
    "fr_hook/sitecustomize.py:is_rpc_server": "/proc/self/cmdline, inside the rank",
    # The reference trainer is the job: it reads and writes its own config and output.
    "trainer/areal_log.py:write_jsonl": "the trainer's own log",
    "trainer/config.py:load_config": "the config its command line names",
    "trainer/layout.py:read_meta": "its own output folder",
    "trainer/run.py:run": "its own output folder and dump",
}


def open_calls(source: str) -> list[tuple[str, int]]:
    """(innermost enclosing function, line) of each opening call in `source`; module-level
    calls are in `<module>`."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in OPENERS:
                    found.append((".".join(scope) or "<module>", child.lineno))
            visit(child, scope)

    visit(ast.parse(source), [])
    return found


def node_calls() -> dict[str, list[int]]:
    """ "module:function" -> the lines of its opening calls, over the whole node package."""
    calls: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for scope, line in open_calls(path.read_text()):
            calls.setdefault(f"{module}:{scope}", []).append(line)
    return calls


def test_every_open_in_the_node_package_is_guarded_or_listed() -> None:
    unlisted = {site: lines for site, lines in node_calls().items() if site not in ALLOWED}
    assert not unlisted, (
        f"open through guarded_read.open_regular, or list with a reason: {unlisted}"
    )


def test_the_allow_list_names_only_calls_that_exist() -> None:
    stale = sorted(set(ALLOWED) - set(node_calls()))
    assert not stale, f"listed, but no longer opens a file: {stale}"


def test_the_four_guarded_readers_open_nothing_themselves() -> None:
    """The log reads, Flight Recorder dumps, name-resolve records and the version reader
    went through openers of their own; now none of them calls an opener but /proc's."""
    calls = node_calls()
    for module in ("agent/logs.py", "agent/flight_recorder.py", "name_resolve.py"):
        assert not [site for site in calls if site.startswith(module + ":")], module
    assert {s for s in calls if s.startswith("versions.py:")} == {
        "versions.py:_proc_environ", "versions.py:process_versions", "versions.py:_credentials"
    }  # fmt: skip


def test_the_scan_sees_every_way_to_open_and_where() -> None:
    source = (
        "open(p)\n"
        "def read(p):\n    return os.open(p, 0)\n"
        "class Reader:\n    def load(self):\n        return self.p.read_text()\n"
        "def outer():\n    def inner():\n        q.read_bytes()\n"
        "def guarded(p):\n    return open_regular(p).read(10)\n"
    )
    assert open_calls(source) == [
        ("<module>", 1), ("read", 3), ("Reader.load", 6), ("outer.inner", 9)
    ]  # fmt: skip


# --------------------------------------------------------------------------------------
# open_regular against what another user plants


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def planted() -> Iterator[Path]:
    """A shared sticky folder (as /tmp) where `nobody` plants; no descriptor is left open
    by a refusal."""
    with shared_tmp() as folder:
        before = open_fds()
        yield folder
        assert open_fds() <= before, "a refused file's descriptor was left open"


def refusal(path: Path, **kwargs: object) -> Refused:
    with pytest.raises(Refused) as caught:
        open_regular(str(path), **kwargs).close()  # type: ignore[arg-type]
    return caught.value


@needs_nobody
def test_a_fifo_is_refused_at_once_not_a_hang(planted: Path) -> None:
    fifo = planted / "main.log"
    as_nobody("mkfifo", str(fifo))
    result: list[BaseException] = []

    def attempt() -> None:
        try:
            open_regular(str(fifo)).close()
        except BaseException as exc:  # recorded for the assertion below
            result.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(30)  # a blocking open would never return: no writer ever comes
    assert not thread.is_alive(), "opening a FIFO blocked"
    assert isinstance(result[0], Refused) and result[0].reason == NOT_REGULAR
    assert str(result[0]) == f"{fifo} is not a regular file"


@needs_nobody
def test_links_are_never_followed_at_the_end_and_only_trusted_ones_on_the_way(
    planted: Path,
) -> None:
    secret = planted / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "key").write_text("secret")
    final = planted / "final"
    as_nobody("ln", "-s", str(secret / "key"), str(final))
    with pytest.raises(OSError) as caught:
        open_regular(str(final))
    assert caught.value.errno == errno.ELOOP  # O_NOFOLLOW refused the final link
    # A folder link on the way: the kernel would follow it; resolve_links does not when
    # `nobody` owns it, and does when root does.
    as_nobody("ln", "-s", str(secret), str(planted / "by-nobody"))
    why = refusal(planted / "by-nobody" / "key", links_of=())
    assert why.reason == LINK and why.st is None
    assert str(why) == f"{planted / 'by-nobody'} is a symlink owned by nobody: not followed"
    (planted / "by-root").symlink_to(secret)
    with open_regular(str(planted / "by-root" / "key"), links_of=()) as opened:
        assert opened.read(100) == b"secret" and opened.path == str(secret / "key")


@needs_nobody
def test_only_the_trusted_owners_file_is_read(planted: Path) -> None:
    theirs = planted / "ENTRY"
    as_nobody("sh", "-c", f"echo 10.0.0.1:22 > {theirs}")
    why = refusal(theirs, owners={0})
    assert why.reason == OWNER and why.st is not None and why.st.st_uid == 65534
    assert refusal(theirs, owners=()).reason == OWNER  # an unknown user trusts no one
    with open_regular(str(theirs), owners={65534}, max_bytes=64) as entry:
        assert entry.read() == b"10.0.0.1:22\n"


@needs_nobody
def test_a_file_past_its_bound_is_refused_before_and_after_it_is_checked(planted: Path) -> None:
    big = planted / "dump"
    as_nobody("sh", "-c", f"head -c 5000 /dev/zero > {big}")
    why = refusal(big, max_bytes=4096)
    assert why.reason == TOO_LARGE and why.size == 5000
    small = planted / "grows"
    as_nobody("sh", "-c", f"head -c 10 /dev/zero > {small}")
    with open_regular(str(small), max_bytes=4096) as opened:
        as_nobody("sh", "-c", f"head -c 8000 /dev/zero >> {small}")  # grows after the check
        with pytest.raises(Refused) as grown:
            opened.read()
    assert grown.value.reason == TOO_LARGE and grown.value.size == 4097
    with open_regular(str(small)) as unbounded, pytest.raises(ValueError):
        unbounded.read()  # opened without a bound: every read must name one


def test_a_folder_is_not_a_regular_file(tmp_path: Path) -> None:
    why = refusal(tmp_path)
    assert why.reason == NOT_REGULAR and why.st is not None
    with pytest.raises(FileNotFoundError):
        open_regular(str(tmp_path / "absent"))
