"""`areal-console batch` as a user runs it, locally and through a node's agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from areal_console.core.batches.source import RemoteBatchSource
from areal_console.core.connection.fleet import Fleet
from areal_console.core.targets.resolve import local_node
from areal_node.batches import BatchError, UnsafePickleError

from tests.support.fixtures import batch_dumps as bf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli-dump")
    bf.write_trajectory_dump(
        d, steps=[0, 1, 2], dp_size=2, n_groups=4, group_size=4, with_prox_logp=True
    )
    bf.write_model_config(d)
    return d


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")]),
        "AREAL_CONSOLE_DATA_DIR": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "share"),
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "areal_console", "batch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_json_summary_of_a_file_matches_design_schema(dump: Path, env: dict[str, str]) -> None:
    out = cli(env, str(dump / "step_000001_dp_1.pt"), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    for key in (
        "path",
        "format",
        "step",
        "dp_rank",
        "groups",
        "samples",
        "tokens",
        "keys",
        "stats",
        "warnings",
    ):
        assert key in s
    assert (s["format"], s["step"], s["dp_rank"], s["groups"], s["samples"]) == (
        "trajectory_dump",
        1,
        1,
        4,
        16,
    )
    assert s["keys"]["attention_mask"] == {
        "shape": [16, s["keys"]["input_ids"]["shape"][1]],
        "dtype": "bool",
        "kind": "tensor",
    }
    assert set(s["stats"]["task_reward"]) == {"mean", "std", "min", "max"}
    assert set(s["stats"]["reward"]) == {"mean", "std", "min", "max"}
    assert s["stats"]["no_eos_ratio"] is not None


@pytest.mark.slow
def test_text_output_of_a_directory_and_a_sample(dump: Path, env: dict[str, str]) -> None:
    out = cli(env, str(dump))
    assert out.returncode == 0, out.stderr
    assert "AReaL trajectory dump directory: 3 steps, 6 files" in out.stdout
    assert "no_eos_ratio" in out.stdout and "response_len" in out.stdout
    one = cli(env, str(dump), "--sample", "5", "--step", "0", "--dp-rank", "1", "--json")
    assert one.returncode == 0, one.stderr
    view = json.loads(one.stdout)
    groups = torch.load(dump / "step_000000_dp_1.pt", weights_only=True)
    g = groups[view["group"]]
    assert view["tokens"] == g["input_ids"][view["row"], : view["seq_len"]].tolist()


def test_user_errors_are_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    bf.write_checkpoint(tmp_path / "model.pt")
    out = cli(env, str(tmp_path / "model.pt"))
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1
    assert "not a rollout batch: it is a model checkpoint" in out.stderr
    missing = cli(env, str(tmp_path / "nope.pt"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    assert "Traceback" not in missing.stderr


class Shell:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_shell_running_pickle_says_what_it_would_call(
    tmp_path: Path, env: dict[str, str]
) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "step_000000.pt"
    torch.save([{"x": Shell(str(marker))}], path)
    out = cli(env, str(path))
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert out.stderr == (
        f"error: {path}: refused to load: it holds pickled objects that could run code when "
        f"loaded (it would call {os.system.__module__}.system); --trust-pickle would run it: "
        "use it only if you trust who wrote it\n"
    )
    assert not marker.exists()


@pytest.mark.slow
def test_through_the_local_agent(dump: Path, env: dict[str, str], tmp_path: Path) -> None:
    """`--node` ships batches.py to the agent (the SSH code path) and reads next to the file."""
    node = local_node().name
    out = cli(env, str(dump), "--node", node, "--json")
    assert out.returncode == 0, out.stderr
    remote = json.loads(out.stdout)
    local = json.loads(cli(env, str(dump), "--json").stdout)
    assert remote == local
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, ...]:
            return (open, (str(marker), "w"))

    torch.save([{"x": Payload()}], tmp_path / "step_000000.pt")
    refused = cli(env, str(tmp_path / "step_000000.pt"), "--node", node)
    assert refused.returncode == 1 and "could run code when loaded" in refused.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_remote_source_over_a_session(dump: Path, tmp_path: Path) -> None:
    fleet = Fleet([local_node()])
    try:
        source = RemoteBatchSource(fleet.sessions[0])
        table = source.samples(str(dump), step=2, dp_rank=0)
        assert table["total"] == 16 and len(table["rows"]) == 16
        view = source.sample(str(dump), 3, step=2, dp_rank=0)
        assert view["index"] == 3 and len(view["tokens"]) == view["seq_len"]
        listing = source.list_dir(str(dump))
        assert [f["file"] for f in listing["files"]][:2] == [
            "step_000000_dp_0.pt",
            "step_000000_dp_1.pt",
        ]
        with pytest.raises(BatchError, match="no such file"):
            source.summary(str(tmp_path / "missing.pt"))
        torch.save({"x": Fleet}, tmp_path / "odd.pt")  # a class global: refused
        with pytest.raises(UnsafePickleError):
            source.summary(str(tmp_path / "odd.pt"))
    finally:
        fleet.close()


def test_no_numpy_warning_even_without_numpy(dump: Path, env: dict[str, str]) -> None:
    """numpy is a declared dependency; where it is absent anyway (a node's python, a
    `--no-deps` install) torch's "Failed to initialize NumPy" warning must not reach the
    user: not from the CLI, not from the reference trainer that replays run."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.replace(" ", "").startswith("numpy>=") for d in deps), deps
    hide_numpy = "import sys; sys.modules['numpy'] = None\n"
    via_cli = subprocess.run(
        [sys.executable, "-c", hide_numpy + "from areal_console.cli import main\n"
         f"raise SystemExit(main(['batch', {str(dump / 'step_000001_dp_1.pt')!r}]))"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert via_cli.returncode == 0, via_cli.stderr
    assert via_cli.stderr == ""
    trainer = subprocess.run(
        [sys.executable, "-c", hide_numpy + "import areal_node.trainer.run"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert trainer.returncode == 0 and trainer.stderr == "", trainer.stderr
    # Without the filter the same import does warn (the check above can fail).
    bare = subprocess.run(
        [sys.executable, "-c", hide_numpy + "import torch; torch.zeros(1)"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "Failed to initialize NumPy" in bare.stderr
