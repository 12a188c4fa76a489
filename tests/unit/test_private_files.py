"""The one way we write (`areal_node.private_files`, the console's `private_files`): what
another local user (`nobody`, planting folders and links in a shared folder) can and
cannot make root write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from areal_console.core.common import private_files
from areal_console.core.common.errors import UserError

from tests.support.nobody import as_nobody, needs_nobody, shared_tmp


def test_folders_are_made_0700_and_ours(tmp_path: Path) -> None:
    made = private_files.private_dir(tmp_path / "a" / "b" / "c")
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        st = folder.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    older = tmp_path / "older"
    older.mkdir(mode=0o755)  # made by an older version with the default mode
    os.chmod(older, 0o755)
    private_files.private_dir(older)
    assert stat.S_IMODE(older.stat().st_mode) == 0o700
    with pytest.raises(UserError, match="exists already"):
        private_files.new_dir(made)


def test_files_are_new_and_replaced_whole(tmp_path: Path) -> None:
    with private_files.create(tmp_path / "d" / "f", "w") as fh:
        fh.write("one")
    assert stat.S_IMODE((tmp_path / "d" / "f").stat().st_mode) == 0o600
    with pytest.raises(UserError, match="exists already"):
        private_files.create(tmp_path / "d" / "f")
    private_files.replace(tmp_path / "d" / "f", "two")
    assert (tmp_path / "d" / "f").read_text() == "two"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f"]  # no temporary left


@needs_nobody
def test_another_users_folders_and_links_are_refused() -> None:
    with shared_tmp() as shared:
        root_only = shared / "root-only"
        root_only.mkdir(mode=0o700)
        as_nobody("mkdir", str(shared / "theirs"))
        as_nobody("ln", "-s", str(root_only), str(shared / "link"))
        for where in (shared / "theirs" / "runs", shared / "link" / "runs"):
            with pytest.raises(UserError, match="uid"):
                private_files.private_dir(where)
            with pytest.raises(UserError):
                private_files.replace(where / "run.json", "{}")
        assert not list(root_only.iterdir())
        os.chmod(root_only, 0o777)  # writable by all, not sticky: nothing in it is safe
        with pytest.raises(UserError, match="writable by other users"):
            private_files.create(root_only / "report.md", private=False)


@needs_nobody
def test_a_planted_link_is_replaced_never_followed() -> None:
    """`report -o /tmp/x/report.md` where `nobody` put a link to a root-only file first."""
    with shared_tmp() as shared:
        secret = shared / "secret"
        secret.write_text("root's")
        secret.chmod(0o600)
        report = shared / "report.md"
        as_nobody("ln", "-s", str(secret), str(report))
        private_files.replace(report, "the report", private=False)
        assert secret.read_text() == "root's"
        assert not report.is_symlink() and report.read_text() == "the report"
        assert stat.S_IMODE(report.stat().st_mode) == 0o600
        as_nobody("ln", "-s", str(secret), str(shared / "known_hosts"))
        with pytest.raises(UserError):
            private_files.create(shared / "known_hosts", private=False)
        assert secret.read_text() == "root's"


@needs_nobody
def test_the_run_folder_on_a_login_host_follows_the_same_rules(tmp_path: Path) -> None:
    """The `sh` that makes a replay's run folder on a login host (`slurm.runs.run_folder`
    through SSH), run here as it runs there: 0700, new, and never under a folder or link
    another user planted."""
    from areal_console.core.slurm.client import LocalRunner
    from areal_console.core.slurm.runs import REMOTE_RUN_FOLDER

    def make(data_home: Path, run: str) -> tuple[int, str]:
        env = dict(os.environ, XDG_DATA_HOME=str(data_home))
        done = LocalRunner(env).run(["sh", "-c", REMOTE_RUN_FOLDER, "sh", run], timeout=30)
        return done.returncode, (done.stdout.strip() or done.stderr.strip())

    code, made = make(tmp_path / "data", "replay-1")
    assert code == 0 and made == str(tmp_path / "data" / "areal-console" / "runs" / "replay-1")
    for folder in (Path(made), Path(made).parent, Path(made).parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert make(tmp_path / "data", "replay-1")[0] != 0  # never an existing folder
    with shared_tmp() as shared:
        as_nobody("mkdir", str(shared / "areal-console"))
        code, said = make(shared, "replay-2")
        assert code != 0 and "is not a folder of ours" in said
        assert not list((shared / "areal-console").iterdir())
