"""py-spy: finding the program, dumping every rank's stacks in parallel, explaining failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from areal_node.agent.cmdline import is_python
from areal_node.agent.procfs import read_all
from areal_node.agent.protocol import OpError, arg, op
from areal_node.agent.pyspy_beside import PROGRAM
from areal_node.agent.threads import parallel_map
from areal_node.guarded_read import Refused, open_regular

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent


def cpu_count() -> int:
    """The cores this process may run on (its affinity, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def find_pyspy() -> str | None:
    """The py-spy to run: the first on PATH, unless that is a version manager's shim
    script (pyenv, asdf: a shell and the manager run before every dump, five times the
    dump's own cost) and the py-spy installed beside this Python is the program itself."""
    import shutil

    found = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(beside, os.X_OK) or os.path.isdir(beside):
        return found
    if found is None or (not _is_executable_binary(found) and _is_executable_binary(beside)):
        return beside
    return found


def _is_executable_binary(path: str) -> bool:
    """An ELF or Mach-O program, not a script (a FIFO there is none, at once)."""
    try:
        with open_regular(path, links_of=()) as program:
            magic = program.read(4)
    except (OSError, Refused):
        return False
    return magic == b"\x7fELF" or magic in (b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


def explain_pyspy_failure(pid: int, text: str, returncode: int | None) -> tuple[str, str]:
    """(reason code, actionable message) for a failed py-spy dump."""
    low = text.lower()
    if not os.path.exists(f"/proc/{pid}"):
        return "gone", f"process {pid} exited during capture"
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        return "permission", (
            f"permission denied attaching to {pid}: run as the job's user or root, set "
            "kernel.yama.ptrace_scope=0 (sysctl), or give the container SYS_PTRACE"
        )
    if "failed to find python version" in low or "failed to get python version" in low:
        return "not_python", f"{pid} is not a Python process (a wrapper? pass its Python child)"
    if "no such process" in low or "failed to open process" in low:
        return "gone", f"process {pid} exited during capture"
    first = text.strip().splitlines()[-1] if text.strip() else f"exit code {returncode}"
    return "error", f"py-spy failed on {pid}: {first}"


def _is_wrapper(pid: int) -> bool:
    """A live process that is not Python itself (a shell, a launcher binary)."""
    try:
        raw = read_all(f"/proc/{pid}/cmdline").split(b"\0")
        cmdline = [a.decode(errors="replace") for a in raw if a]
        comm = read_all(f"/proc/{pid}/comm").decode(errors="replace").strip()
    except OSError:
        return False  # gone: py-spy will say so
    return not is_python(cmdline, comm)


def python_descendants(pid: int, procs: dict[int, dict[str, Any]]) -> list[int]:
    """The nearest Python processes at or below `pid` (walks shells and launchers' children)."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p["ppid"], []).append(p["pid"])
    out: list[int] = []
    stack = [pid]
    while stack:
        cur = stack.pop()
        info = procs.get(cur)
        if info is not None and is_python(info["cmdline"], info["comm"]) and cur != pid:
            out.append(cur)
            continue
        stack.extend(children.get(cur, []))
    return sorted(out)


SOURCES = ("auto", "py-spy", "worker")
# py-spy failures a rank's own worker server can stand in for (with `source` "auto").
WORKER_FALLBACK = frozenset({"permission", "missing"})


@op("pyspy")
def op_pyspy(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Each PID's stacks, all in parallel: `py-spy dump --json`, one py-spy per PID; with
    `source` "worker" from the rank's worker server instead, with "auto" (the default)
    from the worker server where py-spy cannot attach or is missing. Every dump says
    where it came from (`source`: "py-spy" or "worker_server")."""
    pids = args.get("pids")
    if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
        raise OpError("argument 'pids' must be a list of integers")
    source = arg(args, "source", str, "auto")
    if source not in SOURCES:
        raise OpError(f"argument 'source' must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "py-spy":
        return _pyspy_dumps(agent, pids, args)
    if source == "worker":
        return {"dumps": key_stacks(_worker_dumps(agent, pids, args, {}, count=True))}
    reply = _pyspy_dumps(agent, pids, args)
    failed = {
        d["pid"]: d
        for d in reply["dumps"]
        if not d.get("ok") and d.get("reason") in WORKER_FALLBACK
    }
    if failed:
        # py-spy reported progress for what it ran; where it ran nothing, the worker server does
        count = all(d.get("reason") == "missing" for d in reply["dumps"])
        fallback = {
            d["pid"]: d for d in _worker_dumps(agent, list(failed), args, failed, count=count)
        }
        reply["dumps"] = key_stacks(
            [fallback.get(d["pid"], d) if d["pid"] in failed else d for d in reply["dumps"]]
        )
    return reply


def _worker_dumps(
    agent: Agent,
    pids: list[int],
    args: dict[str, Any],
    pyspy_failed: dict[int, dict[str, Any]],
    count: bool,
) -> list[dict[str, Any]]:
    """Each PID's stacks from its worker server, in parallel (each within its own deadline
    of at most 3 s). A PID that py-spy failed on and that has no answering server keeps
    py-spy's reason, with the worker server's added to its error."""
    from areal_node.agent.worker_server import MAX_DEADLINE, worker_stacks

    timeout = min(arg(args, "timeout", float, MAX_DEADLINE), MAX_DEADLINE)
    records = parallel_map(lambda pid: worker_stacks(pid, timeout), pids, 64)
    out: list[dict[str, Any]] = []
    for record in records:
        before = pyspy_failed.get(record["pid"])
        if before is not None:
            record["requested_pid"] = before.get("requested_pid", record["pid"])
        if before is not None and not record.get("ok"):
            if record.get("reason") == "gone":
                record = {**before, "reason": "gone", "error": record["error"]}
            else:
                record = {**before, "error": f"{before.get('error')}; {record.get('error')}"}
        progress = args.get("progress")
        if progress is not None and count:
            agent.emit("pyspy_progress", token=progress, pid=record["pid"],
                       ok=record.get("ok", False), done=len(out) + 1, total=len(pids))  # fmt: skip
        out.append(record)
    return out


def _pyspy_dumps(agent: Agent, pids: list[int], args: dict[str, Any]) -> dict[str, Any]:
    """`py-spy dump --json` of each PID, all in parallel, one py-spy per PID."""
    timeout = arg(args, "timeout", float, 10.0)
    nonblocking = arg(args, "nonblocking", bool, False)
    native = arg(args, "native", bool, False)
    with_locals = arg(args, "locals", bool, False)
    # Echoed in one `pyspy_progress` event per finished dump (for a progress display).
    progress = args.get("progress")
    # py-spy is CPU-bound while it reads a process: more at once than cores only queues.
    parallel = arg(args, "parallel", int, 0) or cpu_count()
    pyspy = find_pyspy()
    beside: dict[int, str] = {}  # requested pid -> the py-spy in its job's own bin/
    missing = []
    if pyspy is None:
        from areal_node.agent.pyspy_beside import pyspy_beside

        for pid in pids:
            found, refused = pyspy_beside(pid)
            if found is not None:
                beside[pid] = found
                continue
            error = "py-spy not found on this node: pip install py-spy"
            missing.append(
                {"pid": pid, "ok": False, "reason": "missing", "source": "py-spy",
                 "error": f"{error}; {refused}" if refused else error}
            )  # fmt: skip
        pids = [pid for pid in pids if pid in beside]
        if not pids:
            return {"dumps": missing}
    targets: list[tuple[int, int]] = []  # (requested pid, dumped pid)
    wrappers = [pid for pid in pids if _is_wrapper(pid)]
    # Only wrappers need the whole process table (to find their Python children).
    procs = agent.processes.snapshot() if wrappers else {}
    for pid in pids:
        if pid in wrappers:
            kids = python_descendants(pid, procs)
            targets.extend((pid, kid) for kid in kids) if kids else targets.append((pid, pid))
        else:
            targets.append((pid, pid))

    def dump(pair: tuple[int, int]) -> dict[str, Any]:
        requested, pid = pair
        program = beside.get(requested) or pyspy or PROGRAM
        cmd = [program, "dump", "--json", "--pid", str(pid)]
        if nonblocking:
            cmd.append("--nonblocking")
        if native:
            cmd.append("--native")
        if with_locals:
            cmd.append("--locals")
        started = time.monotonic()
        record: dict[str, Any] = {"pid": pid, "requested_pid": requested, "source": "py-spy"}
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            record.update(
                ok=False, reason="timeout", error=f"py-spy timed out after {timeout:g}s on {pid}"
            )
            return record
        record["seconds"] = round(time.monotonic() - started, 3)
        out = proc.stdout.decode(errors="replace")
        if proc.returncode == 0:
            try:
                record.update(ok=True, threads=json.loads(out))
                return record
            except ValueError:
                pass
        reason, message = explain_pyspy_failure(
            pid, proc.stderr.decode(errors="replace") + out, proc.returncode
        )
        record.update(ok=False, reason=reason, error=message)
        return record

    done = 0
    done_lock = threading.Lock()

    def dump_and_report(pair: tuple[int, int]) -> dict[str, Any]:
        nonlocal done
        record = dump(pair)
        if progress is not None:
            with done_lock:
                done += 1
                count = done
            agent.emit(
                "pyspy_progress",
                token=progress,
                pid=record["pid"],
                ok=record.get("ok", False),
                done=count,
                total=len(targets),
            )
        return record

    dumps = parallel_map(dump_and_report, targets, min(64, parallel))
    used = pyspy or ", ".join(sorted(set(beside.values())))
    return {"dumps": key_stacks(dumps) + missing, "pyspy": used}


def key_stacks(dumps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every thread a `key` (a digest of its frames) and send each distinct stack's
    frames once: ranks of a job mostly share their stacks, so a node's reply shrinks to a
    few stacks, and the console interns a stack by one lookup instead of reading frames."""
    try:  # hashlib's own blake2b, without loading OpenSSL for every other digest (3 ms)
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b

    sent: set[str] = set()
    for d in dumps:
        for thread in d.get("threads") or []:
            if "key" in thread:
                continue
            frames = thread.get("frames") or []
            text = json.dumps(frames, separators=(",", ":"), sort_keys=True)
            key = blake2b(text.encode(), digest_size=12).hexdigest()
            thread["key"] = key
            if key in sent:
                del thread["frames"]
            else:
                sent.add(key)
    return dumps
