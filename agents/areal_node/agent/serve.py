"""The agent: reads JSON-line requests, runs each op on a worker thread, writes replies.

    request  {"id": 1, "op": "sample", "args": {...}}
    reply    {"id": 1, "ok": true, "result": {...}}  or  {"id": 1, "ok": false, "error": "..."}
    event    {"event": "sample", ...}                 (streams, job exits, log lines)

It never listens on a socket. Unknown ops and malformed lines answer an error; EOF on stdin
exits. This module holds the session's own ops (hello, ping, sample, stream, load,
shutdown) and imports the modules whose ops it serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# Importing a module registers its ops; the rest are imported on first use (LATER).
from areal_node import launcher
from areal_node.agent import pyspy  # noqa: F401
from areal_node.agent.gpus import GpuCollector
from areal_node.agent.processes import process_record, select_processes
from areal_node.agent.procfs import FULL_SAMPLE_EVERY, ProcessCollector
from areal_node.agent.protocol import (
    AGENT_VERSION,
    LATER,
    OPS,
    PROTOCOL_VERSION,
    OpError,
    ReplyUnsendable,
    arg,
    deadline,
    encode_message,
    handler,
    known_ops,
    op,
)
from areal_node.agent.pyspy import find_pyspy
from areal_node.agent.servers import ServerStates
from areal_node.agent.threads import Call, Deadlines, Workers


class Agent:
    """One agent: its stdin carries requests, its stdout replies and events."""

    def __init__(self, stdin: Any = None, stdout: Any = None) -> None:
        self.stdin = stdin or sys.stdin.buffer
        self.stdout = stdout or sys.stdout.buffer
        self._write_lock = threading.Lock()
        self.processes = ProcessCollector()
        self.gpus = GpuCollector()
        self.servers = ServerStates(self.processes.proc_root)
        self._sample_lock = threading.Lock()
        self._streams: dict[int, threading.Event] = {}
        self._stream_ids = 0
        self.exiting = False  # set when no request can run any more (the interpreter exits)
        # 16 threads serve requests; one stuck past its deadline is replaced, up to 64.
        self.pool = Workers(16, "areal-agent", hard_limit=64)
        self.deadlines = Deadlines(self._expire)
        self.started = time.time()
        self.extensions: dict[str, Any] = {}
        self._primed = False
        self._samples = 0
        self._watch: set[int] | None = None  # pids whose /proc/PID/stat each sample reads
        self._identities: dict[int, tuple[Any, Any, dict[str, Any]]] = {}
        # Under `srun`, one step may carry the agents of many nodes on one stdin (the
        # console broadcasts); a request naming another node is for another agent.
        self.node_name: str | None = os.environ.get("SLURMD_NODENAME") or None
        # Other nodes' agents this one started and relays for (`relay.py`): name -> child.
        self.relays: dict[str, Any] = {}

    # output --------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        """Write one message. One that cannot be encoded within the bounds (too deep, too
        big, a huge integer) goes out as an error of its request, or event, instead."""
        try:
            data = encode_message(message)
        except ReplyUnsendable as exc:
            error: dict[str, Any]
            if "event" in message:
                error = {"event": "unsendable", "of": str(message["event"])[:64], "error": str(exc)}
            else:
                error = {"id": message.get("id"), "ok": False, "error": str(exc)}
            data = encode_message(error)
        self._write(data)

    def _write(self, data: bytes) -> None:
        with self._write_lock:
            try:
                self.stdout.write(data)
                self.stdout.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the console went away; EOF on stdin ends us shortly

    def emit(self, event: str, **fields: Any) -> None:
        self.send({"event": event, **fields})

    # dispatch ------------------------------------------------------------------------
    def handle_line(self, line: bytes) -> None:
        text = line.strip()
        if not text:
            return
        if text[:1] == b">":  # a line for a child this agent relays for
            from areal_node.agent import relay

            relay.forward(self, text)
            return
        try:
            request = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            self.send({"id": None, "ok": False, "error": f"malformed request line: {exc}"})
            return
        if not isinstance(request, dict):
            self.send({"id": None, "ok": False, "error": "malformed request: not a JSON object"})
            return
        target = request.get("node")
        if target is not None and self.node_name is not None:
            mine = target == self.node_name or (
                isinstance(target, list) and self.node_name in target
            )
            if not mine:
                return
        rid = request.get("id")
        name = request.get("op")
        args = request.get("args")
        if args is None:
            args = {}
        if not isinstance(name, str) or (name not in OPS and name not in LATER):
            known = ", ".join(known_ops())
            self.send({"id": rid, "ok": False, "error": f"unknown op {name!r} (known: {known})"})
            return
        if not isinstance(args, dict):
            self.send({"id": rid, "ok": False, "error": f"bad arguments for {name}: not an object"})
            return
        call = Call(rid, name, deadline(name, args))
        try:
            self.pool.submit(self._run, call, args)
            self.deadlines.add(call)
        except RuntimeError:  # the interpreter is exiting (an agent served by a thread of the
            self.exiting = True  # console, e.g. after Ctrl-C): stop serving, say nothing

    def _run(self, call: Call, args: dict[str, Any]) -> None:
        """Run one request and answer it; every path out answers (or the deadline did)."""
        if not call.start():
            return  # answered at its deadline while still queued
        name = call.name
        reply: dict[str, Any]
        try:
            try:
                run = handler(name)
                if run is None:  # a module in LATER that did not register its op
                    raise OpError(f"op {name} is not served by this agent")
                reply = {"ok": True, "result": run(self, args)}
            except OpError as exc:
                reply = {"ok": False, "error": str(exc)}
            except (TypeError, ValueError, KeyError) as exc:
                reply = {"ok": False, "error": f"bad arguments for {name}: {_text(exc)}"}
            except Exception as exc:  # never crash the agent
                reply = {"ok": False, "error": f"{name} failed: {_detail(exc)}"}
            # Encoded here, under the same protection: a reply that cannot be (too deep,
            # too big, a huge integer) answers an error instead.
            message = {"id": call.rid, **reply}
            try:
                data = encode_message(message)
            except ReplyUnsendable as exc:
                data = encode_message({"id": call.rid, "ok": False, "error": f"{name}: {exc}"})
            if call.finish():
                self._write(data)
        except BaseException as exc:  # even an interrupt: the request gets its answer
            if call.finish():
                self.send({"id": call.rid, "ok": False, "error": f"{name} failed: {_detail(exc)}"})
            raise
        finally:
            if call.overdue:
                self.pool.overdue(-1)

    def _expire(self, call: Call) -> None:
        """At a request's deadline: answer it with a timeout error if nothing answered yet;
        the thread still running it no longer counts against the pool's limit."""
        if not call.expire():
            return
        self.send(
            {"id": call.rid, "ok": False, "timeout": True,
             "error": f"{call.name}: no answer within {call.seconds:g} s (its deadline)"}
        )  # fmt: skip
        if call.overdue:
            self.pool.overdue(+1)

    def serve(self) -> None:
        self.emit(
            "ready",
            protocol=PROTOCOL_VERSION,
            agent_version=AGENT_VERSION,
            pid=os.getpid(),
            node=self.node_name,
        )
        while not self.exiting:
            line = self.stdin.readline()
            if not line:
                break
            self.handle_line(line)
        for stop in self._streams.values():
            stop.set()
        if self.relays:
            from areal_node.agent import relay

            relay.close_all(self)
        self.servers.close()
        self.pool.shutdown(wait=False, cancel=True)
        self.deadlines.stop()

    # sampling ------------------------------------------------------------------------
    def sample(
        self, include_all: bool = False, cpu: bool = True, gpus: bool = True
    ) -> dict[str, Any]:
        """Processes (and GPUs). `cpu=False` skips the first call's CPU% baseline wait
        (a capture needs no CPU%); `gpus=False` leaves NVML alone."""
        with self._sample_lock:
            if cpu and not self._primed:
                # CPU% needs two readings: take a short baseline on the first sample.
                self.processes.snapshot()
                time.sleep(0.2)
                self._primed = True
            # Between full readings (every FULL_SAMPLE_EVERY samples, a pid reused meanwhile
            # is caught then), only the processes reported last time, their parents and
            # new processes are read again.
            self._samples += 1
            full = include_all or self._watch is None or self._samples % FULL_SAMPLE_EVERY == 0
            procs = self.processes.snapshot(None if full else self._watch)
            gpu_list: list[dict[str, Any]] = []
            gpu_use: dict[int, list[tuple[int, int | None]]] = {}
            gpu_error: str | None = None
            if gpus:
                gpu_list, gpu_use, gpu_error = self.gpus.collect()
            procs.pop(os.getpid(), None)  # the agent itself is not part of any job
            chosen = select_processes(procs, include_all, self._identities)
            self._watch = set(chosen) | {procs[pid]["ppid"] for pid in chosen}
            records = [
                process_record(procs[pid], self.processes.rss(pid), gpu_use,
                               self.processes.stdout_file(pid))
                for pid in chosen
            ]  # fmt: skip
        servers = [r for r in records if r.get("server")]
        if servers:
            self.servers.attach(servers)
        return {
            "time": time.time(),
            "hostname": os.uname().nodename,
            "gpus": gpu_list,
            "gpu_error": gpu_error,
            "processes": records,
        }


def _text(exc: BaseException) -> str:
    """An exception's message, bounded (its text may carry hostile input)."""
    try:
        text = str(exc)
    except Exception:  # a str() that itself raises (an integer too long to print)
        text = "(unprintable)"
    return text if len(text) <= 500 else text[:500] + "..."


def _detail(exc: BaseException) -> str:
    """`Type: message` of an exception, bounded."""
    text = _text(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@op("hello")
def op_hello(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    import importlib.machinery
    import importlib.util
    import site

    def present(module: str) -> bool:
        """Importable here, or by the user's environment: the agent runs isolated (`-I`),
        but a replay with this interpreter sees PYTHONPATH and the user's site-packages."""
        pythonpath = launcher.clean_pythonpath(os.environ.get("PYTHONPATH", ""))
        user_paths = [p for p in pythonpath.split(os.pathsep) if p]
        user_paths.append(site.getusersitepackages())
        try:
            if importlib.util.find_spec(module) is not None:
                return True
            found = importlib.machinery.PathFinder.find_spec(module, user_paths)
            return found is not None
        except (ImportError, ValueError):
            return False

    # Loading NVML can take a second on a GPU node: only when the console asks.
    ok: bool | None = None
    nvml_error: str | None = None
    if arg(args, "gpus", bool, True):
        ok, nvml_error = agent.gpus.available()
    return {
        "protocol": PROTOCOL_VERSION,
        "agent_version": AGENT_VERSION,
        "hostname": os.uname().nodename,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "pid": os.getpid(),
        "user": _user(),
        "tools": {
            "py-spy": find_pyspy(),
            "pynvml": ok,
            "nvml_error": nvml_error,
            "torch": present("torch"),
        },
        "ops": known_ops(),
    }


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


@op("ping")
def op_ping(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    return {"time": time.time()}


@op("sample")
def op_sample(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    return agent.sample(
        arg(args, "all", bool, False),
        cpu=arg(args, "cpu", bool, True),
        gpus=arg(args, "gpus", bool, True),
    )


@op("stream")
def op_stream(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Start a periodic sample stream: `sample` events every `interval` seconds; with
    `delta`, only the readings while nothing else changed (agent/readings.py)."""
    from areal_node.agent.readings import DeltaStream

    interval = arg(args, "interval", float, 1.0)
    include_all = arg(args, "all", bool, False)
    delta = DeltaStream() if arg(args, "delta", bool, False) else None
    if not 0.05 <= interval <= 3600:
        raise OpError(f"argument 'interval' must be between 0.05 and 3600 seconds, got {interval}")
    agent._stream_ids += 1
    sid = agent._stream_ids
    stop = threading.Event()
    agent._streams[sid] = stop

    def loop() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            sample = agent.sample(include_all)
            fields = delta.event(sample) if delta is not None else {"data": sample}
            agent.emit("sample", stream=sid, **fields)
            next_at += interval
            stop.wait(max(0.0, next_at - time.monotonic()))

    threading.Thread(target=loop, name=f"stream-{sid}", daemon=True).start()
    return {"stream": sid, "interval": interval, "delta": delta is not None}


@op("stream_stop")
def op_stream_stop(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    sid = arg(args, "stream", int, 0)
    stop = agent._streams.pop(sid, None)
    if stop is None:
        raise OpError(f"no stream {sid}")
    stop.set()
    return {"stream": sid, "stopped": True}


@op("load")
def op_load(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Add an extension's ops: `module`, a module of the payload the agent runs from (the
    batch reader's `areal_node.batches.ops`), whose `OPS` dict adds request handlers. Its
    imports (torch) happen here, not at the agent's start."""
    import importlib

    name = arg(args, "name", str, "")
    module = arg(args, "module", str, "")
    if not name.isidentifier():
        raise OpError(f"bad extension name {name!r}")
    parts = module.split(".")
    if parts[0] != "areal_node" or len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise OpError(f"bad extension module {module!r}: not a module of areal_node")
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        raise OpError(f"cannot load {module}: {exc}") from None
    ops = getattr(loaded, "OPS", {})
    for op_name, func in ops.items():
        OPS[op_name] = func
    agent.extensions[name] = loaded
    return {"name": name, "ops": sorted(ops)}


@op("shutdown")
def op_shutdown(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    threading.Timer(0.05, lambda: os._exit(0)).start()
    return {"bye": True}


# After its console is gone (EOF on stdin, or its parent exited and it was adopted), the
# agent waits this long for running requests to answer, then exits: within 5 s in all.
EXIT_GRACE = 3.0
PARENT_CHECK_EVERY = 1.0


def watch_parent(parent: int, gone: Callable[[], None], every: float = PARENT_CHECK_EVERY) -> None:
    """Call `gone()` once the process's parent is no longer `parent` (it exited: the
    agent was adopted by init or a subreaper). A console that dies without closing the
    agent's stdin (a child holding the pipe) still ends its agent this way."""

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        gone()

    threading.Thread(target=loop, name="parent-watch", daemon=True).start()


def main() -> None:
    agent = Agent()

    def orphaned() -> None:
        agent.pool.shutdown(wait=True, cancel=True, timeout=EXIT_GRACE)
        os._exit(0)

    watch_parent(os.getppid(), orphaned)
    agent.serve()
    # The requests still running answer before the exit, for a bounded time: a request
    # stuck on a hostile file or socket does not keep the agent (often root) alive.
    agent.pool.shutdown(wait=True, timeout=EXIT_GRACE)
    with contextlib.suppress(Exception):
        agent.stdout.flush()
    os._exit(0)
