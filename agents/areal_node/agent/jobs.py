"""Jobs: detached launches (replays, trainers), their logs and exit codes; dump indexes.

Each job runs under a small wrapper that is the leader of a new session: it starts the
command in its own process group with output appended to the log, forwards SIGTERM to
that group, and writes `exit.json` when the command ends. The record therefore survives
the agent (and the console) going away: a later agent reads the job directory and knows
whether the job is running, how it ended, or that it vanished without a word ("unknown").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from areal_node import launcher, private_files
from areal_node.agent.procfs import parse_stat, read_all, start_ticks
from areal_node.agent.protocol import OpError, arg, op
from areal_node.constants import CHECKPOINT_DIR, CHECKPOINT_FILE, DUMP_FILE, META_FILE, METRICS_FILE

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent


# The supervisor of a launched job. It forks first and the first process exits at once:
# the supervisor is no child of the agent's process, so a Ray worker hosting the agent
# (which kills its children as it exits) does not take the job with it; it tells the agent
# its pid on stdout before it starts the job.
JOB_WRAPPER = (
    "import json,os,signal,subprocess,sys,time\n"
    "d=sys.argv[1];log=sys.argv[2];argv=sys.argv[3:]\n"
    "if os.fork():os._exit(0)\n"
    "os.setsid()\n"
    "sys.stdout.write('%d\\n'%os.getpid());sys.stdout.flush()\n"
    "os.dup2(os.open(os.devnull,os.O_WRONLY),1)\n"
    "out=os.fdopen(os.open(log,os.O_WRONLY|os.O_APPEND|os.O_CREAT|os.O_NOFOLLOW,0o600),'ab')\n"
    "stopped=[False]\n"
    "def write(name,data):\n"
    " t=os.path.join(d,'.%s.%d.tmp'%(name,os.getpid()))\n"
    " f=os.fdopen(os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o600),'w')\n"
    " json.dump(data,f);f.close();os.replace(t,os.path.join(d,name))\n"
    "try:\n"
    " p=subprocess.Popen(argv,stdin=subprocess.DEVNULL,stdout=out,stderr=subprocess.STDOUT,"
    "preexec_fn=os.setpgrp)\n"
    "except OSError as e:\n"
    " out.write(('cannot start %s: %s\\n'%(argv[0],e.strerror)).encode());out.close()\n"
    " write('exit.json',{'exit_code':127,'ended':time.time(),'stopped':False,"
    "'error':'cannot start %s: %s'%(argv[0],e.strerror)});sys.exit(127)\n"
    "write('child.json',{'pid':p.pid})\n"
    "def term(sig,frame):\n"
    " stopped[0]=True\n"
    " try:os.killpg(p.pid,sig)\n"
    " except OSError:pass\n"
    "signal.signal(signal.SIGTERM,term);signal.signal(signal.SIGINT,term)\n"
    "code=p.wait()\n"
    "write('exit.json',{'exit_code':code,'ended':time.time(),'stopped':stopped[0]})\n"
)

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def node_cache_dir() -> str:
    """This node's cache: `$XDG_CACHE_HOME/areal-console` or `~/.cache/areal-console`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "areal-console")


def jobs_root(args: dict[str, Any]) -> str:
    root = args.get("jobs_dir") or os.path.join(node_cache_dir(), "jobs")
    if not isinstance(root, str):
        raise OpError("argument 'jobs_dir' must be a string")
    return os.path.expanduser(root)


def _job_dir(args: dict[str, Any]) -> tuple[str, str]:
    job_id = arg(args, "job", str, "")
    if not JOB_ID.match(job_id):
        raise OpError(f"bad job id {job_id!r}")
    path = os.path.join(jobs_root(args), job_id)
    if not os.path.isfile(os.path.join(path, "job.json")):
        raise OpError(f"no job {job_id} on this node")
    return job_id, path


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: str, data: dict[str, Any]) -> None:
    private_files.replace(path, json.dumps(data))


def job_status(path: str) -> dict[str, Any]:
    """One job's record with its state: running | finished | failed | stopped | unknown."""
    record = _read_json(os.path.join(path, "job.json")) or {}
    ended = _read_json(os.path.join(path, "exit.json"))
    child = _read_json(os.path.join(path, "child.json")) or {}
    record["child_pid"] = child.get("pid")
    if ended is not None:
        code = ended.get("exit_code")
        record.update(exit_code=code, ended=ended.get("ended"), error=ended.get("error"))
        if ended.get("stopped"):
            record["state"] = "stopped"
        else:
            record["state"] = "finished" if code == 0 else "failed"
        return record
    pid = record.get("pid")
    alive = isinstance(pid, int) and start_ticks(pid) == record.get("start_ticks")
    if alive:
        try:  # our own child that exited but was not reaped yet is not running
            alive = parse_stat(read_all(f"/proc/{pid}/stat"))[1] != "Z"
        except (OSError, ValueError, IndexError):
            alive = False
    record.update(exit_code=None, state="running" if alive else "unknown")
    if not alive:
        record["error"] = "the job's supervisor ended without recording an exit code"
    return record


JOB_POLL = 0.5  # the supervisor is no child of ours: its end is polled for


def _watch_job(agent: Agent, path: str, job_id: str) -> None:
    status = job_status(path)
    while status.get("state") == "running":
        time.sleep(JOB_POLL)
        status = job_status(path)
    agent.emit("job_exit", job=job_id, state=status.get("state"), exit_code=status.get("exit_code"))


@op("job_launch")
def op_job_launch(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Start `argv` detached (new session), output to a log; `{job_dir}` in argv/log is expanded."""
    argv = args.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise OpError("argument 'argv' must be a non-empty list of strings")
    env_extra = args.get("env") or {}
    if not isinstance(env_extra, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_extra.items()
    ):
        raise OpError("argument 'env' must map names to strings")
    job_id = arg(args, "job", str, "")
    job_id = job_id or time.strftime("job-%Y%m%d-%H%M%S-") + os.urandom(3).hex()
    if not JOB_ID.match(job_id):
        raise OpError(f"bad job id {job_id!r}")
    root = jobs_root(args)
    path = os.path.join(root, job_id)
    if os.path.lexists(path):
        raise OpError(f"job {job_id} already exists on this node")
    try:
        private_files.new_dir(path)
    except OSError as exc:
        raise OpError(f"cannot create job directory {path}: {exc.strerror or exc}") from None
    # argv and log are templates: `{job_dir}` is filled here, `{{`/`}}` are literal braces.
    argv = [fill_placeholders(a, {"job_dir": path}) for a in argv]
    log = arg(args, "log", str, "") or "{job_dir}/output.log"
    log = fill_placeholders(os.path.expanduser(log), {"job_dir": path})
    cwd = os.path.expanduser(arg(args, "cwd", str, "") or path)
    if not os.path.isdir(cwd):
        raise OpError(f"working directory {cwd} does not exist on this node")
    log_dir = os.path.dirname(os.path.abspath(log))
    try:  # in the job's folder: made ours; elsewhere (the caller named it): checked
        if log_dir == path or log_dir.startswith(path + os.sep):
            private_files.private_dir(log_dir)
        else:
            private_files.named_folder(log_dir)
    except OSError as exc:
        raise OpError(f"cannot write the job's log in {log_dir}: {exc.strerror or exc}") from None
    env = dict(os.environ)
    env.update(env_extra)
    env = launcher.clean_env(env)  # no PYTHONPATH entry that means the working directory
    python = sys.executable or "python3"
    record = {
        "job": job_id,
        "name": arg(args, "name", str, "") or os.path.basename(argv[0]),
        "argv": argv,
        "env": env_extra,
        "cwd": cwd,
        "log": log,
        "dir": path,
        "meta": args.get("meta") if isinstance(args.get("meta"), dict) else {},
        "started": time.time(),
        "host": os.uname().nodename,
    }
    _write_json(os.path.join(path, "job.json"), record)
    proc = subprocess.Popen(
        launcher.isolated(python, JOB_WRAPPER, path, log, *argv),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives the agent and the console's SSH session
    )
    assert proc.stdout is not None
    with proc.stdout:
        said = proc.stdout.readline(64)  # the supervisor's pid, once it has forked away
    proc.wait()
    try:
        pid = int(said)
    except ValueError:
        raise OpError(f"the job's supervisor did not start (exit code {proc.returncode})") from None
    record.update(pid=pid, start_ticks=start_ticks(pid))
    _write_json(os.path.join(path, "job.json"), record)
    threading.Thread(target=_watch_job, args=(agent, path, job_id), daemon=True).start()
    return job_status(path)


@op("jobs")
def op_jobs(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Every job recorded on this node (newest first), or those named in `jobs`."""
    root = jobs_root(args)
    wanted = args.get("jobs")
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    out = []
    for name in names:
        if wanted is not None and name not in wanted:
            continue
        path = os.path.join(root, name)
        if JOB_ID.match(name) and os.path.isfile(os.path.join(path, "job.json")):
            out.append(job_status(path))
    out.sort(key=lambda r: r.get("started") or 0, reverse=True)
    return {"jobs": out}


@op("job_stop")
def op_job_stop(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """SIGTERM the job's process group; SIGKILL it after `grace` seconds."""
    _, path = _job_dir(args)
    grace = arg(args, "grace", float, 10.0)
    status = job_status(path)
    if status["state"] != "running":
        return status
    with contextlib.suppress(ProcessLookupError):
        os.kill(status["pid"], signal.SIGTERM)  # the wrapper forwards it to the job's group
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(path, "exit.json")):
            return job_status(path)
        time.sleep(0.05)
    for pid in (status.get("child_pid"), status["pid"]):
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
    if not os.path.exists(os.path.join(path, "exit.json")):
        _write_json(
            os.path.join(path, "exit.json"),
            {"exit_code": -9, "ended": time.time(), "stopped": True},
        )
    return job_status(path)


def tail_lines(path: str, lines: int, max_bytes: int = 1 << 20) -> list[str]:
    """The last `lines` lines of a file, reading at most `max_bytes` from its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return []
    text = data.decode(errors="replace").splitlines()
    return text[-lines:] if lines > 0 else []


@op("job_tail")
def op_job_tail(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    job_id, path = _job_dir(args)
    lines = arg(args, "lines", int, 50)
    status = job_status(path)
    return {
        "job": job_id,
        "state": status["state"],
        "exit_code": status.get("exit_code"),
        "log": status.get("log"),
        "lines": tail_lines(status.get("log") or "", lines),
    }


@op("stage_file")
def op_stage_file(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """A file cached by content hash (e.g. the reference trainer); on a miss, send its
    content as `source` (text) or `data` (base64, for binary files such as the payload)."""
    import hashlib

    name = arg(args, "name", str, "")
    digest = arg(args, "sha256", str, "")
    if not re.match(r"^[A-Za-z0-9_.-]+$", name) or not re.match(r"^[0-9a-f]{64}$", digest):
        raise OpError("arguments 'name' and 'sha256' must be a plain file name and a hex digest")
    path = os.path.join(node_cache_dir(), "files", digest, name)
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() == digest:
                return {"path": path, "present": True}
    source, encoded = args.get("source"), args.get("data")
    if source is None and encoded is None:
        return {"path": path, "present": False}
    if encoded is not None:
        import base64
        import binascii

        if not isinstance(encoded, str):
            raise OpError("argument 'data' must be a base64 string")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise OpError("argument 'data' is not valid base64") from None
    elif isinstance(source, str):
        data = source.encode()
    else:
        raise OpError("argument 'source' must be a string")
    if hashlib.sha256(data).hexdigest() != digest:
        raise OpError(f"content of {name} does not match its sha256")
    try:
        private_files.replace(path, data)
    except OSError as exc:
        raise OpError(f"cannot stage {name}: {exc.strerror or exc}") from None
    return {"path": path, "present": True, "written": True}


@op("replay_index")
def op_replay_index(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """What a trajectory dump directory holds: steps and their dp ranks, checkpoints, metadata."""
    path = os.path.abspath(os.path.expanduser(arg(args, "path", str, "")))
    if os.path.isfile(path) and DUMP_FILE.match(os.path.basename(path)):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise OpError(f"no dump directory at {path} on this node")
    steps: dict[int, list[int | None]] = {}
    for name in os.listdir(path):
        m = DUMP_FILE.match(name)
        if m:
            rank = int(m.group(2)) if m.group(2) is not None else None
            steps.setdefault(int(m.group(1)), []).append(rank)
    for ranks in steps.values():
        ranks.sort(key=lambda r: -1 if r is None else r)
    try:
        ckpts = sorted(
            int(n[5:-3])
            for n in os.listdir(os.path.join(path, CHECKPOINT_DIR))
            if CHECKPOINT_FILE.match(n)
        )
    except OSError:
        ckpts = []
    meta = _read_json(os.path.join(path, META_FILE))
    return {
        "dir": path,
        "steps": {str(k): v for k, v in sorted(steps.items())},
        "checkpoints": ckpts,
        "metrics": os.path.isfile(os.path.join(path, METRICS_FILE)),
        "meta": {
            k: meta.get(k)
            for k in ("trainer", "trainer_version", "world_size", "device", "device_name")
        }
        if meta
        else {},
    }


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([a-z_]+)\}")


def fill_placeholders(text: str, values: dict[str, str]) -> str:
    """Fill `{name}` fields of a launch template in one pass: a value is never searched
    for fields itself (a path containing `{job_dir}` stays as it is). `{{` and `}}` are
    literal braces; unknown fields are kept for a later pass."""

    def one(match: Any) -> str:
        token, name = match.group(0), match.group(1)
        if name is None:
            return token[0]
        return values.get(name, token)

    return _PLACEHOLDER.sub(one, text)


def escape_placeholders(value: str) -> str:
    """`value` as literal text inside a template (braces doubled)."""
    return value.replace("{", "{{").replace("}", "}}")
