"""Parsing Slurm's output (recorded from the real test cluster) and srun's labelled lines."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.slurm.channel import (
    LABEL_CHUNK,
    LabelledLines,
    shared_source_line,
    srun_argv,
)
from areal_console.core.slurm.client import (
    CommandResult,
    SlurmClient,
    expand_hostlist,
    outside_job_env,
    parse_gres_gpus,
    parse_hostnames,
    parse_job_record,
    parse_node_records,
    parse_scontrol_record,
    parse_squeue_json,
    parse_squeue_lines,
    parse_step_records,
    running_job,
)
from areal_console.core.slurm.launch import BatchRequest, batch_script, overlap_step_argv
from areal_console.core.targets.resolve import SlurmTarget
from areal_node.agent.serve import Agent

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_running_job_record() -> None:
    job = parse_job_record(recorded("job_running.txt"))
    assert (job.job_id, job.name, job.user, job.state) == ("5", "slurm_gloo.sh", "root", "RUNNING")
    assert job.nodes == ["node1", "node2", "node3"] and job.nodelist == "node[1-3]"
    assert job.num_tasks == 6 and job.batch_host == "node1" and job.partition == "debug"
    assert job.gpus == {"node1": [0], "node2": [0], "node3": [0]}
    assert job.tres_per_node == "gres:gpu:1"
    assert job.active


def test_per_node_gpu_indices_differ_between_detail_groups() -> None:
    job = parse_job_record(recorded("job_gres_idx1.txt"))
    assert job.name == "second job"  # a value with a space
    assert job.gpus == {"node1": [1], "node2": [1], "node3": [0]}


def test_pending_and_completed_records() -> None:
    pending = parse_job_record(recorded("job_pending.txt"))
    assert (pending.state, pending.reason, pending.nodes) == ("PENDING", "BeginTime", [])
    assert pending.name == "pending job" and pending.gpus == {}
    assert not pending.active
    done = parse_job_record(recorded("job_completed.txt"))
    assert done.state == "COMPLETED" and not done.active


def test_scontrol_record_keeps_repeated_keys_in_order() -> None:
    pairs = parse_scontrol_record(recorded("job_gres_idx1.txt").strip())
    assert [v for k, v in pairs if k == "Nodes"] == ["node[1-2]", "node3"]
    assert [v for k, v in pairs if k == "GRES"] == ["gpu:1(IDX:1)", "gpu:1(IDX:0)"]


def test_steps_and_node_states() -> None:
    steps = parse_step_records(recorded("steps_running.txt"))
    assert [(s.step_id, s.name, s.tasks, s.nodes) for s in steps] == [
        ("5.batch", "batch", 1, ["node1"]),
        ("5.0", "bash", 6, ["node1", "node2", "node3"]),
    ]
    healthy = parse_node_records(recorded("nodes.txt"))
    assert {n: s for n, (s, _) in healthy.items()} == {
        "node1": "MIXED",
        "node2": "MIXED",
        "node3": "MIXED",
    }
    states = parse_node_records(recorded("nodes_not_responding.txt"))
    assert states["node3"][0] == "MIXED+NOT_RESPONDING"
    job = parse_job_record(recorded("job_running.txt"))
    job.node_states = {n: s for n, (s, _) in states.items()}
    assert job.unreachable_nodes() == {"node3": "Slurm reports node node3 MIXED+NOT_RESPONDING"}


def test_squeue_formats() -> None:
    jobs = parse_squeue_lines(recorded("squeue.txt"))
    assert [(j.job_id, j.state, j.nodes, j.tres_per_node) for j in jobs] == [
        ("6", "PENDING", [], "gres:gpu:2"),
        ("5", "RUNNING", ["node1", "node2", "node3"], "gres:gpu:1"),
    ]
    # Slurm 22.05 ignores `-j` with --json: the caller filters by id.
    by_id = {j.job_id: j for j in parse_squeue_json(recorded("squeue.json"))}
    assert by_id["5"].state == "RUNNING" and by_id["5"].nodes == ["node1", "node2", "node3"]
    assert by_id["5"].user == "root" and by_id["5"].batch_host == "node1"
    assert by_id["6"].state == "PENDING" and by_id["6"].nodes == []


def test_hostlist_expansion_matches_scontrol() -> None:
    expected = parse_hostnames(recorded("hostnames.txt"))
    assert expand_hostlist("node[1-3],gpu-a[08-10],x") == expected
    assert expected == ["node1", "node2", "node3", "gpu-a08", "gpu-a09", "gpu-a10", "x"]
    assert parse_gres_gpus("gpu:a100:2(IDX:0,3),nic:1") == [0, 3]
    assert parse_gres_gpus("gpu:4(IDX:0-3)") == [0, 1, 2, 3]
    assert parse_gres_gpus("(null)") == []


def test_labelled_lines_reassemble_srun_chunks() -> None:
    """Real `srun --label` output of two tasks printing 1024, 2050 and 10 characters."""
    lines = LabelledLines()
    out: dict[int, list[bytes]] = {}
    for raw in io.BytesIO(recorded("srun_label.txt").encode()):
        got = lines.feed(raw)
        if got is not None:
            out.setdefault(got[0], []).append(got[1])
    expected = [b"x" * 1024 + b"\n", b"y" * 2050 + b"\n", b"z" * 10 + b"\n"]
    assert out == {0: expected, 1: expected}
    assert lines.feed(b"srun: warning: not a task line\n") is None
    # Wide labels (10+ tasks) are padded: " 3: ..."
    assert lines.feed(b" 3: {}\n") == (3, b"{}\n")
    assert LABEL_CHUNK == 1024


def test_srun_argv_is_an_argv_list() -> None:
    target = SlurmTarget(job_id="42", nodes=("a1", "a2"), gpus=8)
    argv = srun_argv(target, ["a1", "a2"], python="/opt/py/bin/python3")
    assert argv[:3] == ["srun", "--overlap", "--jobid=42"]
    assert "--nodelist=a1,a2" in argv and "--ntasks-per-node=1" in argv
    assert "--gres=gpu:8" in argv and "--input=all" in argv and "--label" in argv
    # The node's /bin/sh picks the interpreter: the configured one first (see transport).
    assert argv[-7:-5] == ["/bin/sh", "-c"] and argv[-3] == "/opt/py/bin/python3"
    single = srun_argv(SlurmTarget(job_id="42"), ["a1"])
    assert "--label" not in single and not any(a.startswith("--gres") for a in single)


class FakeRunner:
    """Plays back recorded Slurm output (for the error paths of `SlurmClient`)."""

    where = "login host test"

    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def run(
        self, argv: list[str], timeout: float = 30.0, stdin: str | None = None
    ) -> CommandResult:
        self.calls.append(argv)
        key = " ".join(argv[:3])
        return self.answers.get(key, CommandResult(argv, 1, "", "unexpected"))

    def start(self, argv: list[str], what: str, on_stderr=None):  # type: ignore[no-untyped-def]
        raise AssertionError("no steps in these tests")


def test_client_errors_are_one_clear_line() -> None:
    missing = FakeRunner(
        {"scontrol show job": CommandResult([], 1, "", recorded("job_invalid.err"))}
    )
    with pytest.raises(UserError, match=r"^Slurm job 999 not found on login host test"):
        SlurmClient(missing).job("999")
    with pytest.raises(UserError, match="not a Slurm job id"):
        SlurmClient(missing).job("999; rm -rf /")
    absent = FakeRunner({"scontrol show job": CommandResult([], 127, "", "not found")})
    with pytest.raises(UserError, match="`scontrol` is not available on login host test"):
        SlurmClient(absent).job("5")
    pending = FakeRunner(
        {"scontrol show job": CommandResult([], 0, recorded("job_pending.txt"), "")}
    )
    with pytest.raises(UserError, match=r"is PENDING \(BeginTime\): it has no nodes"):
        running_job(SlurmClient(pending), "6")


def test_agent_answers_only_requests_for_its_node() -> None:
    """One srun step shares stdin between nodes: each agent serves only its own requests."""
    out = io.BytesIO()
    written = threading.Event()

    class Out:
        def write(self, data: bytes) -> None:
            out.write(data)
            written.set()

        def flush(self) -> None:
            pass

    agent = Agent(stdin=io.BytesIO(), stdout=Out())
    agent.node_name = "node2"
    agent.handle_line(b'{"node":"node1","id":1,"op":"ping","args":{}}\n')
    # The payload, sent once to the shared step for nodes that lack it, is dropped by
    # agents that already run.
    agent.handle_line(shared_source_line())
    agent.handle_line(b'{"node":"node2","id":2,"op":"ping","args":{}}\n')
    assert written.wait(10)
    agent.pool.shutdown(wait=True)
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["id"] for r in replies] == [2] and replies[0]["ok"]


def test_batch_script_quotes_every_word() -> None:
    request = BatchRequest(
        command=["python3", "replay.py", "--path", "/data/run 1/step_000010.pt", "$(reboot)"],
        gpus_per_node=2,
        chdir="/work/replays",
        env=(("CUDA_LAUNCH_BLOCKING", "1"),),
    )
    script = batch_script(request)
    assert script.splitlines() == [
        "#!/bin/sh",
        "#SBATCH --job-name=areal-replay",
        "#SBATCH --nodes=1",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --gres=gpu:2",
        "#SBATCH --chdir=/work/replays",
        "export CUDA_LAUNCH_BLOCKING=1",
        "exec python3 replay.py --path '/data/run 1/step_000010.pt' '$(reboot)'",
    ]
    with pytest.raises(UserError, match="not an environment variable name"):
        batch_script(BatchRequest(command=["x"], env=(("A;B", "1"),)))
    with pytest.raises(UserError, match="command is empty"):
        batch_script(BatchRequest(command=[]))
    argv = overlap_step_argv("42", "node2", ["python3", "a b.py"], gpus=1)
    assert argv[:3] == ["srun", "--overlap", "--jobid=42"]
    assert "--nodelist=node2" in argv and "--gres=gpu:1" in argv
    assert argv[-3:] == ["--", "python3", "a b.py"]


def test_sacct_lines_give_state_and_exit_code() -> None:
    """`sacct -n -P -X -o JobID,JobName,User,State,ExitCode`, as Slurm 22.05 prints it for
    jobs the queue has forgotten (a cancelled job's state carries who cancelled it)."""
    from areal_console.core.slurm.client import parse_sacct_lines

    text = ("41|exp_t1:rollout|alice|CANCELLED by 0|0:15\n"
            "42|exp_t1:actor|alice|NODE_FAIL|1:0\n"
            "garbage line\n43|x|alice|RUNNING|0:0|extra\n")  # fmt: skip
    jobs = parse_sacct_lines(text)
    assert [(j.job_id, j.name, j.state, j.exit_code) for j in jobs] == [
        ("41", "exp_t1:rollout", "CANCELLED", "0:15"),
        ("42", "exp_t1:actor", "NODE_FAIL", "1:0"),
    ]


def test_a_console_inside_a_job_leaves_that_jobs_variables_out_of_srun() -> None:
    """Inside a job (the watch as a Slurm job of its own) the job's and step's variables
    would shape `srun --jobid OTHER` after it; where Slurm is configured stays. Outside
    a job the environment is passed on as it is (None)."""
    inside = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_NTASKS": "1",
              "SLURM_STEP_ID": "0", "SRUN_CPUS_PER_TASK": "1", "SBATCH_MEM_BIND": "x",
              "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_CLUSTERS": "c1",
              "PATH": "/usr/bin", "HOME": "/home/a"}  # fmt: skip
    assert outside_job_env(inside) == {"SLURM_CONF": "/etc/slurm/slurm.conf",
                                       "SLURM_CLUSTERS": "c1", "PATH": "/usr/bin",
                                       "HOME": "/home/a"}  # fmt: skip
    assert outside_job_env({"SLURM_CONF": "/x", "PATH": "/usr/bin"}) is None
