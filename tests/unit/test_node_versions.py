"""The node's version reader (areal_node/versions.py) on interpreter trees laid out as pip,
venv, an editable AReaL checkout and the NVIDIA driver lay them out, and on live processes.
Nothing it reads is imported or executed."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from areal_node import versions as v


def dist(site: Path, name: str, version: str, **files: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
    )
    for fname, text in files.items():
        (info / fname).write_text(text)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv with torch (CUDA build), NCCL's wheel, SGLang, and AReaL installed editable
    from a git worktree whose branch is only in packed-refs."""
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    os.symlink(sys.executable, prefix / "bin" / "python")
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.10.14\n")
    site = prefix / "lib" / "python3.10" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    (site / "torch" / "version.py").write_text(
        "raise SystemExit('never executed')\n"
        "from typing import Optional\n__version__ = '2.5.1+cu124'\n"
        "debug = False\ncuda: Optional[str] = '12.4'\ngit_version = 'a8d6afb5'\nhip = None\n"
    )
    dist(site, "torch", "2.5.1+cu124")
    dist(site, "nvidia_nccl_cu12", "2.21.5")
    dist(site, "sglang", "0.4.6.post1")
    main_git = tmp_path / "AReaL.git"
    (main_git / "worktrees" / "wt").mkdir(parents=True)
    (main_git / "packed-refs").write_text(
        "# pack-refs with: peeled fully-peeled sorted\n"
        "cbff54d64aaaabbbbccccddddeeeeffff00001111 refs/heads/main\n"
    )
    (main_git / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/main\n")
    (main_git / "worktrees" / "wt" / "commondir").write_text("../..\n")
    checkout = tmp_path / "AReaL"
    (checkout / "areal").mkdir(parents=True)
    (checkout / "areal" / "__init__.py").write_text("")
    (checkout / ".git").write_text(f"gitdir: {main_git / 'worktrees' / 'wt'}\n")
    url = json.dumps({"url": f"file://{checkout}", "dir_info": {"editable": True}})
    dist(site, "areal", "2.0.0", **{"direct_url.json": url})
    return prefix


def test_an_interpreter_tree_read_from_its_files(venv: Path) -> None:
    out = v.interpreter_versions(str(venv / "bin" / "python"))
    assert out["python"] == "3.10.14"
    assert out["torch"] == {"version": "2.5.1+cu124", "cuda": "12.4", "hip": None,
                            "git_version": "a8d6afb5", "nccl": "2.21.5"}  # fmt: skip
    assert out["packages"] == {"areal": "2.0.0", "sglang": "0.4.6.post1", "torch": "2.5.1+cu124"}
    areal = out["areal"]
    assert areal["version"] == "2.0.0" and areal["branch"] == "main"
    assert areal["commit"] == "cbff54d64aaaabbbbccccddddeeeeffff00001111"
    assert areal["checkout"] == str(venv.parent / "AReaL")


def test_a_checkout_on_pythonpath_without_install(tmp_path: Path) -> None:
    checkout = tmp_path / "src"
    (checkout / "areal").mkdir(parents=True)
    (checkout / "areal" / "__init__.py").write_text("")
    (checkout / "pyproject.toml").write_text('[tool.x]\nversion = "9"\n[project]\nname = "areal"\n'
                                             'version = "1.5.0"\n')  # fmt: skip
    (checkout / ".git" / "refs" / "heads").mkdir(parents=True)
    (checkout / ".git" / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
    out = v.interpreter_versions(sys.executable, {"PYTHONPATH": str(checkout)})
    assert out["areal"]["version"] == "1.5.0"
    assert out["areal"]["commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert out["areal"]["branch"] is None  # a detached HEAD


def test_driver_gpus_and_os_from_proc_files(tmp_path: Path) -> None:
    root = tmp_path / "nvidia"
    (root / "gpus" / "0000:18:00.0").mkdir(parents=True)
    (root / "gpus" / "0000:2a:00.0").mkdir(parents=True)
    (root / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
        "GCC version:  gcc version 12.2.0\n"
    )
    for d in (root / "gpus").iterdir():
        (d / "information").write_text("Model: \t\t NVIDIA H200\nIRQ: 16\n")
    assert v.driver_info(str(root)) == {"driver": "550.54.15", "gpus": ["NVIDIA H200"] * 2}
    assert v.driver_info(str(tmp_path / "none")) == {"driver": None, "gpus": []}
    release = tmp_path / "os-release"
    release.write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
    assert v.os_info(str(release))["os"] == "Ubuntu 22.04.4 LTS"


def test_a_live_process_environment_masked_on_the_node(tmp_path: Path) -> None:
    env = {**os.environ, "NCCL_DEBUG": "INFO", "WANDB_API_KEY": "k" * 40, "HF_TOKEN": "hf_x",
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", "import time; print(1, flush=True); "
                             "time.sleep(60)"], env=env, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
        out = v.node_versions([proc.pid])
        interp = out["interpreters"][0]
        import torch

        assert interp["python"] == platform.python_version()
        assert interp["torch"]["version"] == torch.__version__
        assert interp["environment"]["NCCL_DEBUG"] == "INFO"
        assert interp["environment"]["WANDB_API_KEY"] == "***"
        assert interp["environment"]["HF_TOKEN"] == "***"
        assert "k" * 40 not in json.dumps(out)
    finally:
        proc.kill()
        proc.wait()
    gone = v.node_versions([proc.pid], executable=sys.executable)["interpreters"]
    assert gone[0]["error"].startswith(f"cannot read process {proc.pid}")
    assert gone[1]["python"] == platform.python_version()  # the interpreter that ran it


def test_the_op_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="pids"):
        v.op_versions(None, {"pids": ["1"]})
    assert set(v.OPS) == {"versions"}


def test_a_huge_packed_refs_and_looping_refs_are_bounded(tmp_path: Path) -> None:
    import time

    git = tmp_path / "repo" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/a\n")
    (git / "refs" / "heads" / "a").write_text("ref: refs/heads/b\n")
    (git / "refs" / "heads" / "b").write_text("ref: refs/heads/a\n")
    with open(git / "packed-refs", "wb") as fh:
        fh.truncate(1 << 30)  # 1 GiB of holes
    os.mkfifo(git / "commondir")
    t0 = time.monotonic()
    assert v.git_checkout(str(tmp_path / "repo")) is None
    assert time.monotonic() - t0 < 5
    (git / "HEAD").write_text("ref: refs/heads/../../../../etc/hostname\n")
    assert v.git_checkout(str(tmp_path / "repo")) is None
