"""The node agent: protocol, /proc collection and rank detection, over a real local pipe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from areal_console.core.connection.client import AgentClient, AgentDisconnected, AgentError
from areal_console.core.connection.payload import node_payload
from areal_console.core.connection.transport import InProcessChannel, LocalChannel
from areal_node.agent import processes, procfs, protocol, pyspy
from conftest import GlooJob, wait_for


@pytest.fixture()
def client():
    c = AgentClient(LocalChannel())
    c.start()
    yield c
    c.close()


def _nvml_loads() -> bool:
    """Whether NVML initialises on this machine, found out apart from the agent."""
    probe = "import pynvml; pynvml.nvmlInit(); pynvml.nvmlShutdown()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_hello_reports_versions_and_tools(client: AgentClient) -> None:
    hello = client.hello
    assert hello["protocol"] == protocol.PROTOCOL_VERSION
    assert hello["python"] == sys.version.split()[0]
    assert hello["tools"]["torch"] is True
    assert hello["tools"]["py-spy"] and os.path.basename(hello["tools"]["py-spy"]) == "py-spy"
    # NVML as this machine has it, asked directly: on a GPU node it loads; elsewhere its
    # absence is data (with the reason), not a crash.
    if _nvml_loads():
        assert hello["tools"]["pynvml"] is True and hello["tools"]["nvml_error"] is None
    else:
        assert hello["tools"]["pynvml"] is False
        assert hello["tools"]["nvml_error"].startswith("NVML unavailable")
    assert {"hello", "sample", "stream", "pyspy", "load"} <= set(hello["ops"])


def test_unknown_op_and_bad_arguments_answer_errors(client: AgentClient) -> None:
    with pytest.raises(AgentError, match="unknown op 'frobnicate'"):
        client.request("frobnicate")
    with pytest.raises(AgentError, match="argument 'all' must be bool"):
        client.request("sample", {"all": "yes"})
    with pytest.raises(AgentError, match="interval"):
        client.request("stream", {"interval": 0})
    with pytest.raises(AgentError, match="'pids' must be a list"):
        client.request("pyspy", {"pids": "1,2"})
    # The agent is still serving afterwards.
    assert client.request("ping")["time"] > 0


def test_load_adds_the_ops_of_a_payload_module(client: AgentClient) -> None:
    from areal_console.core.batches.source import EXTENSION_MODULE

    for bad in ("os", "areal_node", "areal_node..x", "areal_node.nope"):
        with pytest.raises(AgentError, match=r"bad extension module|cannot load"):
            client.request("load", {"name": "batches", "module": bad})
    loaded = client.request("load", {"name": "batches", "module": EXTENSION_MODULE})
    assert loaded == {"name": "batches", "ops": sorted(loaded["ops"])} and loaded["ops"]
    listing = client.request("batch_list", {"path": "/"})
    assert listing["path"] == "/"


def test_ops_imported_on_first_use_are_the_ones_their_module_registers() -> None:
    """An agent starts without the modules in LATER; each registers exactly its ops there."""
    code = (
        "import importlib, json, sys\n"
        "from areal_node.agent import serve, protocol\n"
        "early = sorted(m for m in protocol.LATER.values() if m in sys.modules)\n"
        "for module in sorted(set(protocol.LATER.values())):\n"
        "    importlib.import_module(module)\n"
        "where = {n: f.__module__ for n, f in protocol.OPS.items()}\n"
        "print(json.dumps({'early': early, 'where': where, 'later': protocol.LATER}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(protocol.__file__)))},
    )  # fmt: skip
    found = json.loads(done.stdout)
    assert found["early"] == [] and len(found["later"]) >= 10
    later_modules = set(found["later"].values())
    registered = {n: m for n, m in found["where"].items() if m in later_modules}
    assert registered == found["later"]


def test_malformed_lines_get_an_error_reply_and_the_agent_survives() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from areal_node.agent.serve import main; main()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(protocol.__file__))),
        },
    )
    assert proc.stdin and proc.stdout
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    proc.stdin.write(b"{not json\n[1,2]\n" + b'{"id": 7, "op": "ping", "args": []}\n')
    proc.stdin.write(b'{"id": 8, "op": "ping"}\n')
    proc.stdin.flush()
    replies = [json.loads(proc.stdout.readline()) for _ in range(4)]
    assert replies[0] == {"id": None, "ok": False, "error": replies[0]["error"]}
    assert replies[0]["error"].startswith("malformed request line")
    assert "not a JSON object" in replies[1]["error"]
    assert replies[2]["id"] == 7 and "not an object" in replies[2]["error"]
    assert replies[3]["id"] == 8 and replies[3]["ok"] is True
    proc.stdin.close()  # EOF: a clean exit
    assert proc.wait(timeout=10) == 0


def test_stream_emits_periodic_samples_and_stops(client: AgentClient) -> None:
    got: list[dict] = []
    client.on_event = got.append
    sid = client.request("stream", {"interval": 0.1})["stream"]
    wait_for(
        lambda: len([e for e in got if e.get("event") == "sample"]) >= 3,
        timeout=10,
        what="three samples",
    )
    assert all(e["stream"] == sid for e in got if e.get("event") == "sample")
    client.request("stream_stop", {"stream": sid})
    n = len(got)
    # The wait is the check: four of the stream's intervals pass without a new sample (no
    # condition can show that nothing more comes).
    time.sleep(0.4)
    assert len(got) <= n + 1  # at most one already in flight
    with pytest.raises(AgentError, match="no stream"):
        client.request("stream_stop", {"stream": sid})


def test_killed_agent_is_reported_with_the_reason() -> None:
    channel = LocalChannel()
    client = AgentClient(channel)
    client.start()
    os.kill(channel.pid, signal.SIGKILL)
    with pytest.raises(AgentDisconnected, match="killed by signal 9"):
        for _ in range(50):
            client.request("ping", timeout=5)
            time.sleep(0.05)
    assert not client.alive


def test_agent_is_shipped_and_cached_by_content_hash(tmp_path, monkeypatch) -> None:
    # The bootstrap caches where the agent keeps its files: $XDG_CACHE_HOME, else ~/.cache.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for _ in range(2):  # the second start finds the cached copy
        client = AgentClient(LocalChannel())
        client.start()
        client.close()
    cached = list((tmp_path / ".cache" / "areal-console").glob("payload-*.pyz"))
    assert len(cached) == 1 and cached[0].read_bytes() == node_payload().data


def test_in_process_agent_serves_the_same_protocol(gloo_job: GlooJob) -> None:
    client = AgentClient(InProcessChannel())
    try:
        hello = client.start(gpus=False)
        assert hello["pid"] == os.getpid()
        # gpus=False: the handshake leaves NVML alone and says it did not look
        assert hello["tools"]["pynvml"] is None and hello["tools"]["nvml_error"] is None
        # cpu=False: no CPU% baseline wait, so no CPU% in the very first sample
        result = client.request("sample", {"cpu": False, "gpus": False})
        ranks = {p["pid"]: p for p in result["processes"] if p["rank"] is not None}
        assert set(gloo_job.rank_pids().values()) <= set(ranks)
        assert all(p["cpu_percent"] is None for p in result["processes"])
        assert result["gpus"] == [] and result["gpu_error"] is None
        rank0 = ranks[gloo_job.rank_pids()[0]]
        assert rank0["master_addr"] and isinstance(rank0["master_port"], int)
        assert rank0["torchelastic_run_id"]  # torchrun sets it (its default is "none")
    finally:
        client.close()
    wait_for(lambda: not client.alive, timeout=10, what="the in-process agent to stop")


def test_pyspy_reports_each_dump_as_it_finishes(client: AgentClient, gloo_job: GlooJob) -> None:
    events: list[dict] = []
    client.on_event = events.append
    pids = sorted(gloo_job.rank_pids().values())
    reply = client.request("pyspy", {"pids": pids, "progress": "t1", "parallel": 2}, timeout=120)
    assert all(d["ok"] for d in reply["dumps"])
    progress = [e for e in events if e["event"] == "pyspy_progress"]
    assert [e["done"] for e in progress] == [1, 2, 3, 4]
    assert {e["pid"] for e in progress} == set(pids)
    assert all(e["token"] == "t1" and e["total"] == 4 and e["ok"] for e in progress)
    assert 1 <= pyspy.cpu_count() <= (os.cpu_count() or 1)


def test_sample_reports_exactly_the_jobs_ranks(client: AgentClient, gloo_job: GlooJob) -> None:
    result = client.request("sample")
    ranks = {p["rank"]: p for p in result["processes"] if p["ppid"] == gloo_job.launcher_pid}
    expected = gloo_job.rank_pids()
    assert {r: p["pid"] for r, p in ranks.items()} == expected
    for rank, proc in ranks.items():
        assert proc["local_rank"] == rank and proc["world_size"] == 4
        assert proc["role"] == "trainer" and proc["ppid"] == gloo_job.launcher_pid
        assert proc["rss"] > 50 * 2**20  # torch is loaded
        assert proc["cpu_percent"] is not None and proc["cpu_percent"] < 50  # blocked, not spinning
        assert proc["state"] in ("S", "R")
        assert "gloo_ranks.py" in proc["cmdline"]
    launcher = [p for p in result["processes"] if p["pid"] == gloo_job.launcher_pid]
    assert launcher and launcher[0]["role"] == "launcher" and launcher[0]["rank"] is None


@pytest.mark.parametrize(
    ("cmdline", "env", "role"),
    [
        (["python3", "-m", "areal.infra.rpc.rpc_server", "--role", "actor"], {}, "actor"),
        (["python3", "-m", "areal.infra.rpc.rpc_server", "--role=rollout"], {}, "rollout"),
        (["python", "-m", "sglang.launch_server", "--model", "x"], {}, "sglang"),
        (["/usr/bin/torchrun", "--nproc-per-node", "8", "train.py"], {}, "launcher"),
        (["python", "-m", "torch.distributed.run", "train.py"], {}, "launcher"),
        (["python", "train.py"], {"RANK": "3"}, "trainer"),
        (["python", "notebook.py"], {}, None),
        # AReaL's launcher shell around a worker is a wrapper, not the worker
        # (areal/infra/utils/proc.py:104-121 at AReaL cbff54d6).
        (
            [
                "/bin/bash",
                "-c",
                "OMP_NUM_THREADS=1 stdbuf -oL python3 -m areal.infra.rpc.rpc_server"
                " --role actor --worker-index 0 2>&1 | tee -a actor.log",
            ],
            {},
            "wrapper",
        ),
        (["tee", "-a", "/logs/actor.log", "/dev/fd/63"], {}, None),
        (
            ["python3", "-m", "areal.v2.inference_service.sglang.launch_server", "--port", "1"],
            {},
            "sglang",
        ),
        (["python3", "-m", "areal.engine.vllm_ext.areal_vllm_server"], {}, "vllm"),
        (["vllm", "serve", "model"], {}, "vllm"),
    ],
)
def test_detect_role(cmdline: list[str], env: dict[str, str], role: str | None) -> None:
    assert processes.detect_role(cmdline, env) == role


def test_parse_stat_handles_spaces_and_parens_in_the_name() -> None:
    raw = b"42 (my (odd) proc) S 7 42 42 0 -1 4194560 0 0 0 0 150 50 0 0 20 0 1 0 999 0 0"
    comm, state, ppid, ticks, start = procfs.parse_stat(raw)
    assert (comm, state, ppid, ticks, start) == ("my (odd) proc", "S", 7, 200, 999)


def test_parse_environ_keeps_only_rank_variables() -> None:
    raw = b"PATH=/bin\0RANK=5\0LOCAL_RANK=1\0WORLD_SIZE=8\0CUDA_VISIBLE_DEVICES=2,3\0X=1=2\0"
    assert procfs.parse_environ(raw) == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "CUDA_VISIBLE_DEVICES": "2,3",
    }
    assert processes.parse_cuda_visible("2,3") == [2, 3]
    assert processes.parse_cuda_visible("GPU-uuid-1") == []


def _program(path, first_bytes: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(first_bytes)
    path.chmod(0o755)
    return str(path)


def test_find_pyspy_skips_a_version_managers_shim_for_the_binary_beside_python(
    tmp_path, monkeypatch
) -> None:
    # pyenv puts a shell script named py-spy first on PATH; the program is beside python.
    shim = _program(tmp_path / "shims" / "py-spy", b"#!/usr/bin/env bash\nexec pyenv\n")
    real = _program(tmp_path / "version" / "bin" / "py-spy", b"\x7fELF\x02\x01\x01")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "version" / "bin" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path / "shims"))
    assert pyspy.find_pyspy() == real
    # A real program first on PATH is taken as it is (the user's choice of py-spy).
    first = _program(tmp_path / "first" / "py-spy", b"\x7fELF\x02\x01\x01")
    monkeypatch.setenv("PATH", f"{tmp_path / 'first'}:{tmp_path / 'shims'}")
    assert pyspy.find_pyspy() == first
    # Nothing beside python: the shim still works, only slower.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "elsewhere" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path / "shims"))
    assert pyspy.find_pyspy() == shim
    # Not on PATH at all: the one beside python.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "version" / "bin" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert pyspy.find_pyspy() == real
