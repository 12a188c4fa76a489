"""`areal-console nodes` on this machine, against a real 4-rank gloo job."""

from __future__ import annotations

import json

from areal_console.core.connection.nodes import GPU_KEYS, PROCESS_KEYS
from conftest import GlooJob, run_cli


def test_nodes_json_reports_exactly_the_jobs_ranks(gloo_job: GlooJob) -> None:
    result = run_cli("nodes", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    [node] = report["nodes"]
    design = ["name", "host", "state", "error", "gpus", "gpu_error", "processes"]
    assert list(node)[: len(design)] == design  # the documented fields first, extras after
    assert node["hostname"] and node["python"] and node["tools"]["torch"] is True
    assert node["state"] == "up" and node["host"] == "local" and node["error"] is None
    assert node["gpus"] == [] and "NVML unavailable" in node["gpu_error"]
    # Other jobs may run on this machine: look at this job's ranks (children of its launcher).
    ranks = [p for p in node["processes"] if p["ppid"] == gloo_job.launcher_pid]
    assert [p["rank"] for p in ranks] == [0, 1, 2, 3]  # in rank order
    assert {p["rank"]: p["pid"] for p in ranks} == gloo_job.rank_pids()
    for p in node["processes"]:
        assert tuple(p) == PROCESS_KEYS
    assert all(p["world_size"] == 4 and p["local_rank"] == p["rank"] for p in ranks)
    assert GPU_KEYS[0] == "index"


def test_nodes_all_adds_other_python_processes(gloo_job: GlooJob) -> None:
    report = json.loads(run_cli("nodes", "--all", "--json").stdout)
    pids = {p["pid"] for p in report["nodes"][0]["processes"]}
    assert set(gloo_job.rank_pids().values()) <= pids
    # The CLI's own interpreter is a Python process without rank variables.
    assert any(
        p["rank"] is None and "areal_console" in p["cmdline"]
        for p in report["nodes"][0]["processes"]
    )


def test_nodes_table_is_readable(gloo_job: GlooJob) -> None:
    result = run_cli("nodes")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert "(local): up via local, python 3." in lines[0]  # and the interpreter the agent runs on
    assert "NVML unavailable" in lines[1]
    header = lines[2].split()
    assert header[:5] == ["RANK", "LOCAL", "WORLD", "ROLE", "PID"]
    pids = {str(pid) for pid in gloo_job.rank_pids().values()}
    rank_rows = [line.split() for line in lines[3:] if len(line.split()) > 4]
    ours = [row for row in rank_rows if row[4] in pids]
    assert [row[0] for row in ours] == ["0", "1", "2", "3"]
    assert all(row[3] == "trainer" and row[2] == "4" for row in ours)
    # Into a pipe nothing is cut: each rank's whole command line, with its job's folder.
    report = json.loads(run_cli("nodes", "--json").stdout)
    commands = {str(p["pid"]): p["cmdline"] for p in report["nodes"][0]["processes"]}
    for row_text in (line for line in lines[3:] if len(line.split()) > 4):
        pid = row_text.split()[4]
        if pid in pids:
            assert row_text.endswith(commands[pid]) and str(gloo_job.workdir) in row_text


def test_nodes_table_fits_the_terminal() -> None:
    """In a terminal, process lines are cut at its width (at the end of the command)."""
    from areal_console.commands.nodes import render_nodes

    node = {"name": "n1", "host": "local", "state": "up", "error": None, "gpus": [],
            "gpu_error": "no devices", "processes": [{
                "rank": 0, "local_rank": 0, "world_size": 2, "role": "trainer", "pid": 7,
                "cpu_percent": 1.0, "rss": 1 << 20, "gpus": [], "cmdline": "python " + "x" * 300,
            }]}  # fmt: skip
    lines = render_nodes([node], width=80).splitlines()
    row = next(line for line in lines if " trainer " in line)
    assert len(row) == 80 and row.endswith("…")
    whole = next(line for line in render_nodes([node]).splitlines() if " trainer " in line)
    assert whole.endswith("x" * 300)


def test_a_relayed_node_names_its_relay_in_the_table_and_header() -> None:
    from areal_console.commands.nodes import render_nodes

    def node(name: str, relay: str | None) -> dict[str, object]:
        return {"name": name, "host": name, "state": "up", "error": None, "gpus": [],
                "gpu_error": None, "processes": [], "via": "ssh", "relay": relay}  # fmt: skip

    text = render_nodes([node("n1", None), node("n3", "n1")])
    rows = {line.split()[0]: line.split()[3:6] for line in text.splitlines()[1:3]}
    assert rows == {"n1": ["ssh", "-", "0"], "n3": ["ssh", "from", "n1"]}
    assert "== n3 (n3): up via ssh from n1" in text.splitlines()
    assert "== n1 (n1): up via ssh" in text.splitlines()


def test_usage_errors_exit_2_without_traceback() -> None:
    result = run_cli("nodes", "--frobnicate")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    result = run_cli("nodes", "--timeout", "soon")
    assert result.returncode == 2 and "'soon' is not a number of seconds" in result.stderr
