"""Which processes a capture takes: the ranks of ONE job, never a neighbour's.

A node may run several jobs (another user's, a second experiment). Processes are grouped
into jobs by what a distributed job shares, most specific first:

1. AReaL experiment/trial: single-controller workers carry `--experiment-name E
   --trial-name T` on their command line (AReaL `areal/infra/rpc/guard/app.py:518-519`);
   the agent reports it as `job` ("E/T"), also for the workers' controller and servers;
2. the rendezvous `MASTER_ADDR:MASTER_PORT` (a loopback address may be reused by a
   separate job on each node: when the same rank shows up on two nodes, each node's
   processes are a job of their own, named after the node);
3. `TORCHELASTIC_RUN_ID` (torchrun's `--rdzv-id`; its default "none" says nothing);
4. `SLURM_JOB_ID`.

A process with none of these (a rank variable alone) belongs to no job: it is taken only
when no job is found at all, or with `all_jobs`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.textfmt import plural

# Roles of non-rank processes that belong to a job and are worth a stack: inference
# servers, AReaL's single-controller controller and its non-training workers. A launcher
# (torchrun) or wrapper (bash, stdbuf, tee) only waits for its children: never dumped.
JOB_ROLES = frozenset(
    {
        "sglang",
        "vllm",
        "data_proxy",
        "rpc_server",
        "controller",
        "rollout",
        "eval-rollout",
        "data",
        "proxy-rollout",
    }
)
NEVER_DUMPED = frozenset({"launcher", "wrapper"})
LOOPBACK = ("127.", "localhost", "::1")
UNSCOPED = "unscoped"


def job_key(node: str, p: Mapping[str, Any]) -> str | None:
    """The job a process record (the agent's `sample`) belongs to, or None."""
    if p.get("job"):
        return f"areal:{p['job']}"
    addr, port = p.get("master_addr"), p.get("master_port")
    if addr and port is not None:
        return f"{addr}:{port}"
    run_id = p.get("torchelastic_run_id")
    if run_id and run_id != "none":
        return f"torchelastic:{run_id}"
    if p.get("slurm_job_id"):
        return f"slurm:{p['slurm_job_id']}"
    return None


def is_candidate(p: dict[str, Any]) -> bool:
    """A rank, a job server, or an AReaL worker; never a launcher or wrapper."""
    if p.get("role") in NEVER_DUMPED:
        return False
    return p.get("rank") is not None or p.get("role") in JOB_ROLES


@dataclass
class JobGroup:
    """One job's processes across nodes: node -> process records."""

    key: str
    processes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.processes.values())

    @property
    def ranks(self) -> list[int]:
        return sorted(
            p["rank"] for ps in self.processes.values() for p in ps if p.get("rank") is not None
        )

    @property
    def command(self) -> str:
        """The command line of its first process, its spaces collapsed."""
        first = next((p for ps in self.processes.values() for p in ps), {})
        return " ".join(str(first.get("cmdline") or "").split())

    def describe(self, others: Sequence[JobGroup] = ()) -> str:
        """One line for a list of jobs: key, ranks, nodes, a command line; beside `others`
        (the rest of the list), the part of it theirs lack (two runs of one script differ
        in an argument or a path, not in the interpreter that starts the line)."""
        ranks = self.ranks
        nodes = sorted(self.processes)
        first = next((p for ps in self.processes.values() for p in ps), {})
        world = first.get("world_size")
        what = plural(len(ranks), "rank") if ranks else plural(self.count, "process", "processes")
        if world and ranks:
            what += f" of {world}"
        where = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes"
        cmd = distinct_command(self.command, [o.command for o in others if o is not self])
        if len(cmd) > 60:
            cmd = cmd[:57] + "..."
        return f"{self.key}  {what} on {where}  {cmd}".rstrip()


def distinct_command(command: str, others: Sequence[str]) -> str:
    """`command`, or where other jobs' command lines share its start, its program and the
    first argument none of them has (`python … trajectory_debug.path=/tmp/run-b/dump`),
    a long one by its end (where a run's folder differs)."""
    words = command.split()
    if not others or not words:
        return command
    theirs = [set(o.split()) for o in others]
    own = [w for w in words[1:] if not any(w in t for t in theirs)]
    if not own or own[0] == words[1]:
        return command
    shown = own[0] if len(own[0]) <= 45 else "…" + own[0][-44:]
    for word in own[1:]:  # more of them while they fit
        if len(shown) + 1 + len(word) > 45:
            break
        shown += " " + word
    return f"{words[0].rsplit('/', 1)[-1]} … {shown}"


class JobChoiceError(ValueError):
    """Several jobs (or none matching `--job`): the user has to pick one."""

    def __init__(self, message: str, jobs: list[JobGroup]) -> None:
        super().__init__(message)
        self.jobs = jobs


def group_jobs(
    sampled: dict[str, list[dict[str, Any]]],
    match: str | None = None,
    slurm_job: str | None = None,
) -> list[JobGroup]:
    """Candidates of every node (filtered by `--match` and `--slurm-job`) as jobs.

    `match` keeps the processes whose command line matches, or whose launcher's or
    wrapper's does (`--match 'torchrun.*train_b'` picks the ranks that torchrun started);
    an AReaL job it matches keeps its servers and controller too (their command lines need
    not match). Jobs come largest first; processes without a job key form the `unscoped`
    group.
    """
    pattern = re.compile(match) if match else None
    groups: dict[str, JobGroup] = {}
    matched: set[str] = set()
    for node, procs in sampled.items():
        started = launched_by_match(procs, pattern) if pattern is not None else set()
        for p in procs:
            if not is_candidate(p):
                continue
            if slurm_job is not None and str(p.get("slurm_job_id") or "") != str(slurm_job):
                continue
            key = job_key(node, p) or UNSCOPED
            hit = (
                pattern is None
                or bool(pattern.search(str(p.get("cmdline") or "")))
                or p.get("pid") in started
            )
            if hit:
                matched.add(key)
            elif not (key.startswith("areal:") and p.get("rank") is None):
                continue
            groups.setdefault(key, JobGroup(key)).processes.setdefault(node, []).append(p)
    found: list[JobGroup] = []
    for g in groups.values():
        if g.key in matched:
            found.extend(_split_reused_loopback(g))
    return sorted(found, key=lambda g: (g.key == UNSCOPED, -g.count, g.key))


def launched_by_match(procs: list[dict[str, Any]], pattern: re.Pattern[str]) -> set[int]:
    """PIDs of one node's processes started, through launchers and wrappers only, by a
    launcher or wrapper (torchrun, `bash -c`) whose command line `pattern` matches: a rank's
    own command line (`python -u train.py`) lacks what the user typed to start the job."""
    by_pid = {p.get("pid"): p for p in procs}
    out: set[int] = set()
    for p in procs:
        cur = by_pid.get(p.get("ppid"))
        for _ in range(8):  # torchrun under `bash -c` under srun's shell at most
            if cur is None or cur.get("role") not in NEVER_DUMPED:
                break
            if pattern.search(str(cur.get("cmdline") or "")):
                out.add(p["pid"])
                break
            cur = by_pid.get(cur.get("ppid"))
    return out


def _split_reused_loopback(group: JobGroup) -> list[JobGroup]:
    """A loopback rendezvous whose ranks repeat across nodes: one job per node."""
    if not group.key.startswith(LOOPBACK) or len(group.processes) < 2:
        return [group]
    ranks = group.ranks
    if len(ranks) == len(set(ranks)):
        return [group]  # one world spread over the nodes (they share the address)
    return [
        JobGroup(f"{node}/{group.key}", {node: procs}) for node, procs in group.processes.items()
    ]


def process_jobs(
    sampled: Iterable[tuple[str, Iterable[Mapping[str, Any]]]],
) -> dict[tuple[str, int], str]:
    """(node, pid) -> the key of the job each process belongs to, as `group_jobs` names
    it for `--job` (a loopback rendezvous whose ranks repeat on several nodes: one job per
    node). Processes with no job key are left out. Any process is keyed, not only the
    candidates of a capture: the Cluster screen shows a job's servers and wrappers too."""
    keys: dict[tuple[str, int], str] = {}
    ranks: dict[str, list[int]] = {}
    nodes: dict[str, set[str]] = {}
    for node, procs in sampled:
        for p in procs:
            pid = p.get("pid")
            key = job_key(node, p)
            if key is None or not isinstance(pid, int):
                continue
            keys[(node, pid)] = key
            nodes.setdefault(key, set()).add(node)
            rank = p.get("rank")
            if isinstance(rank, int):
                ranks.setdefault(key, []).append(rank)
    split = {
        key
        for key, where in nodes.items()
        if key.startswith(LOOPBACK)
        and len(where) > 1
        and len(ranks.get(key, [])) != len(set(ranks.get(key, [])))
    }
    if split:
        for (node, pid), key in keys.items():
            if key in split:
                keys[(node, pid)] = f"{node}/{key}"
    return keys


def choose_job(
    jobs: list[JobGroup], job: str | None = None, match: str | None = None
) -> list[JobGroup]:
    """The one job to capture: `job` (exact key, else the one key containing it), or the
    only job there is (of those `match` picked). Raises `JobChoiceError` listing the jobs
    when it must be asked."""
    keyed = [g for g in jobs if g.key != UNSCOPED]
    if job is not None:
        exact = [g for g in jobs if g.key == job]
        found = exact or [g for g in jobs if job in g.key]
        if len(found) == 1:
            return found
        why = "no job matches" if not found else f"{len(found)} jobs match"
        raise JobChoiceError(f"{why} --job {job!r}; jobs here:\n{_listing(jobs)}", jobs)
    if len(keyed) > 1:
        where = f"--match {match!r} matches {len(keyed)} jobs" if match else (
            f"{len(keyed)} jobs here")  # fmt: skip
        raise JobChoiceError(
            f"{where}; pick one with --job KEY (or --all-jobs):\n{_listing(jobs)}", jobs
        )
    if keyed:
        return keyed
    return jobs  # nothing grouped: the unscoped processes, if any


def _listing(jobs: Iterable[JobGroup]) -> str:
    jobs = list(jobs)
    lines = [f"  {g.describe(jobs)}" for g in jobs]
    return "\n".join(lines) if lines else "  (none)"
