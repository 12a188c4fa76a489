"""The report's version reader (areal_node/versions.py) against a process of another
user (`nobody`, via setpriv) whose PYTHONPATH names a tree it planted: a FIFO in place
of a METADATA file, a `torch/version.py` that breaks the parser, a symlink to a
root-only file, a checkout whose HEAD names a ref outside `.git`. The reader runs as
root, as a node's agent does, in its own process with a time bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nobody import NOBODY, as_nobody, needs_nobody, shared_tmp

pytestmark = needs_nobody
ROOT_TOKEN = "feedfacecafebeef" * 2 + "0123456789"  # 42 hex digits, as a token file holds


@pytest.fixture()
def planted() -> Iterator[tuple[Path, Path]]:
    """(nobody's site directory, a root-only directory with a secret and a hex token)."""
    with shared_tmp() as shared:
        private = shared / "private"
        private.mkdir(mode=0o700)
        (private / "METADATA").write_text("Name: vllm\nVersion: ROOT-ONLY-SECRET\n")
        (private / "token").write_text(ROOT_TOKEN + "\n")
        for f in private.iterdir():
            f.chmod(0o600)
        site = shared / "site"
        as_nobody("mkdir", "-p", f"{site}/torch", f"{site}/sglang-1.0.dist-info",
                  f"{site}/vllm-9.9.dist-info", f"{site}/areal", f"{site}/.git")  # fmt: skip
        yield site, private


def nobody_process(site: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*NOBODY, "env", f"PYTHONPATH={site}", "sleep", "60"])
    nobody_process_started(proc)
    return proc


def versions_as_root(pid: int) -> dict:  # type: ignore[type-arg]
    code = ("import json, sys; from areal_node.versions import node_versions; "
            "print(json.dumps(node_versions([int(sys.argv[1])])))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(pid)], capture_output=True,
                          text=True, timeout=20)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_fifo_and_a_parser_bomb_in_a_planted_tree_do_not_stop_the_reader(
    planted: tuple[Path, Path],
) -> None:
    site, _ = planted
    as_nobody("mkfifo", f"{site}/sglang-1.0.dist-info/METADATA")
    as_nobody("sh", "-c", f"touch {site}/torch/__init__.py; printf '__version__ = 1' > "
                          f"{site}/torch/version.py; for i in $(seq 2000); do printf "
                          f"'+1+1+1+1+1+1+1+1+1+1' >> {site}/torch/version.py; done")  # fmt: skip
    proc = nobody_process(site)
    try:
        t0 = time.monotonic()
        answer = versions_as_root(proc.pid)
        assert time.monotonic() - t0 < 15
    finally:
        proc.kill()
        proc.wait()
    (one,) = answer["interpreters"]
    assert one["pid"] == proc.pid and str(site) in one["import_dirs"]
    assert "sglang" not in one["packages"] and one["torch"] is None


def test_a_planted_link_or_ref_never_reads_a_root_only_file(planted: tuple[Path, Path]) -> None:
    site, private = planted
    as_nobody("ln", "-s", str(private / "METADATA"), f"{site}/vllm-9.9.dist-info/METADATA")
    as_nobody("touch", f"{site}/areal/__init__.py")
    up = "../" * len((site / ".git").parts)
    as_nobody("sh", "-c", f"echo 'ref: {up}{str(private / 'token').lstrip('/')}' > "
                          f"{site}/.git/HEAD")  # fmt: skip
    proc = nobody_process(site)
    try:
        answer = versions_as_root(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    text = json.dumps(answer)
    assert "ROOT-ONLY-SECRET" not in text and ROOT_TOKEN not in text
    (one,) = answer["interpreters"]
    assert one["areal"]["path"] == str(site / "areal") and one["areal"]["commit"] is None
    # The process's own checkout is still read: a well-formed ref in nobody's .git.
    as_nobody("sh", "-c", f"mkdir -p {site}/.git/refs/heads && echo 'ref: refs/heads/main' > "
                          f"{site}/.git/HEAD && echo {'ab' * 20} > {site}/.git/refs/heads/main")  # fmt: skip
    proc = nobody_process(site)
    try:
        areal = versions_as_root(proc.pid)["interpreters"][0]["areal"]
    finally:
        proc.kill()
        proc.wait()
    assert (areal["commit"], areal["branch"]) == ("ab" * 20, "main")


def test_files_its_group_may_read_are_read_and_others_not() -> None:
    """A site directory shared by group (root-owned, 0750, the process's group) is read;
    the same tree of a group the process is not in is not."""
    import grp

    with shared_tmp() as shared:
        for name, group, version in (("ours", "nogroup", "1.0"), ("theirs", "root", "2.0")):
            site = shared / name
            info = site / f"ray-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Name: ray\nVersion: {version}\n")
            gid = grp.getgrnam(group).gr_gid
            for path, mode in ((site, 0o750), (info, 0o750), (info / "METADATA", 0o640)):
                os.chown(path, 0, gid)
                os.chmod(path, mode)
        proc = subprocess.Popen(
            [*NOBODY, "env", f"PYTHONPATH={shared / 'theirs'}:{shared / 'ours'}", "sleep", "60"]
        )
        try:
            nobody_process_started(proc)
            (one,) = versions_as_root(proc.pid)["interpreters"]
        finally:
            proc.kill()
            proc.wait()
    assert one["packages"].get("ray") == "1.0"  # theirs (first on the path) is not readable


def nobody_process_started(proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{proc.pid}/exe").endswith("sleep"):
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError("the nobody process did not start")
