"""Flight Recorder traces (the collective ledger): live from a rank's worker server, or
from the dump files torch (NCCL on timeout) or our launch hook (gloo on a fatal error)
wrote. Dumps are pickles: decoded with an unpickler that builds only plain containers.
"""

from __future__ import annotations

import json
import os
import stat
import time
from typing import TYPE_CHECKING, Any

from areal_node.agent.procfs import (
    CLK_TCK,
    boot_time,
    parse_environ,
    read_all,
    start_ticks,
    to_int,
)
from areal_node.agent.protocol import OpError, arg, op
from areal_node.agent.threads import parallel_map
from areal_node.guarded_read import NOT_REGULAR, OWNER, TOO_LARGE, Refused, open_regular

if TYPE_CHECKING:
    from collections.abc import Callable

    from areal_node.agent.serve import Agent


FR_ENV = (
    "RANK",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "AREAL_FR_SOCKET_DIR",
    "TMPDIR",
    "TORCH_WORKER_SERVER_SOCKET",
)
FR_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
FR_MAX_BYTES = 64 << 20  # a dump or reply larger than this is not a trace
FR_MAX_NODES = 1_000_000  # values visited (a shared subtree counts every time it is reached)
FR_MAX_DEPTH = 12  # nesting of the fields the ledger reads (an entry's sizes are 4 deep)
FR_MAX_INT_BITS = 64
FR_MAX_CHARS = 32 << 20  # characters of all strings together
ENTRY_KEYS = (
    "is_p2p", "process_group", "pg_id", "profiling_name", "input_sizes", "output_sizes",
    "input_dtypes", "collective_seq_id", "state", "retired",
)  # fmt: skip


class TraceDumpError(ValueError):
    """A trace (dump file or live reply) that is not one, or too large or deep to be one:
    the agent's per-rank error (`"kind": "malformed"`), never an exception of the op."""


def safe_unpickle(data: bytes) -> Any:
    """Decode a pickle that may hold only None, bools, numbers, strings and containers."""
    import io
    import pickle

    class PlainUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a trace dump")

        def persistent_load(self, pid: Any) -> Any:
            raise pickle.UnpicklingError("refusing persistent ids in a trace dump")

    return PlainUnpickler(io.BytesIO(data)).load()


class _Budget:
    """What one trace may still spend: values visited and characters."""

    def __init__(self) -> None:
        self.nodes = FR_MAX_NODES
        self.chars = FR_MAX_CHARS


def _plain(value: Any, budget: _Budget, depth: int) -> Any:
    """A bounded copy of `value` made of JSON's types only (tuples and sets become lists,
    keys strings), or TraceDumpError. Every visit counts, so a subtree shared many times
    (cheap in a pickle, huge once expanded) or a container holding itself runs out of
    budget or depth instead of memory or stack."""
    budget.nodes -= 1
    if budget.nodes < 0:
        raise TraceDumpError(f"more than {FR_MAX_NODES} values")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > FR_MAX_INT_BITS:
            raise TraceDumpError(f"an integer of {value.bit_length()} bits")
        return int(value)
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, str):
        budget.chars -= len(value)
        if budget.chars < 0:
            raise TraceDumpError(f"more than {FR_MAX_CHARS} characters of text")
        return str(value)
    if depth <= 0:
        raise TraceDumpError(f"nested deeper than {FR_MAX_DEPTH} levels")
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TraceDumpError(f"a mapping key of type {type(key).__name__}")
            out[str(_plain(key, budget, depth - 1))] = _plain(item, budget, depth - 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item, budget, depth - 1) for item in value]
    raise TraceDumpError(f"a value of type {type(value).__name__}")


def _projected(data: Any) -> dict[str, Any]:
    """The parts of a Flight Recorder dump the ledger reads, bounded (see `_plain`); the
    rest (Python stacks of every entry, ...) is never walked."""
    if not isinstance(data, dict):
        raise TraceDumpError("not a Flight Recorder dump (not a mapping)")
    if "entries" not in data and "pg_status" not in data:
        raise TraceDumpError("not a Flight Recorder dump (no entries, no pg_status)")
    budget = _Budget()
    entries = data.get("entries") or []
    if not isinstance(entries, (list, tuple)):
        raise TraceDumpError("entries is not a list")
    out: dict[str, Any] = {"entries": []}
    for e in entries:
        budget.nodes -= 1
        if budget.nodes < 0:
            raise TraceDumpError(f"more than {FR_MAX_NODES} values")
        if not isinstance(e, dict):
            raise TraceDumpError("an entry is not a mapping")
        out["entries"].append(
            {k: _plain(e[k], budget, FR_MAX_DEPTH - 2) for k in ENTRY_KEYS if k in e}
        )
    for key in ("version", "pg_config", "pg_status", "rank"):
        if key in data:
            out[key] = _plain(data[key], budget, FR_MAX_DEPTH - 1)
    return out


def _bounded_slim(load: Any, blob: bytes) -> dict[str, Any]:
    """`slim_trace` of what `load(blob)` decodes, or TraceDumpError (never another)."""
    if len(blob) > FR_MAX_BYTES:
        raise TraceDumpError(f"{len(blob)} bytes: too large for a trace")
    try:
        data = load(blob)
    except TraceDumpError:
        raise
    except Exception as exc:  # anything a hostile blob makes the decoder raise
        raise TraceDumpError(f"not decodable: {type(exc).__name__}: {str(exc)[:200]}") from None
    projected = _projected(data)
    try:
        return slim_trace(projected)
    except TraceDumpError:
        raise
    except Exception as exc:  # a field of the wrong type
        raise TraceDumpError(f"malformed: {type(exc).__name__}: {str(exc)[:200]}") from None


def decode_dump(blob: bytes) -> dict[str, Any]:
    """A dump file (pickle) as the reduced trace the agent relays, or TraceDumpError."""
    return _bounded_slim(safe_unpickle, blob)


def decode_live(body: bytes) -> dict[str, Any]:
    """A worker server's JSON trace as the reduced trace, or TraceDumpError."""
    return _bounded_slim(json.loads, body)


def slim_trace(data: Any) -> dict[str, Any]:
    """A Flight Recorder dump reduced to what the ledger reads, per process group, as
    columns: the collectives' sequence ids (a range when they run without gaps) and, per
    collective, an index into a small table of what ranks must agree on (op, input and
    output sizes and dtypes). Thousands of entries become two short integer lists, so a
    large job's traces travel and compare cheaply. Point-to-point calls are left out."""
    if not isinstance(data, dict):
        raise ValueError("not a Flight Recorder dump (not a mapping)")
    if "entries" not in data and "pg_status" not in data:
        raise ValueError("not a Flight Recorder dump (no entries, no pg_status)")
    groups: dict[str, dict[str, Any]] = {}
    tables: dict[str, dict[str, int]] = {}
    for e in data.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group") or ("", "")
        name = str(pg[0])
        group = groups.get(name)
        if group is None:
            desc = str(pg[1]) if len(pg) > 1 else ""
            group = groups[name] = {
                "name": name, "desc": desc, "pg_id": e.get("pg_id"),
                "rows": [], "table": [],
            }  # fmt: skip
            tables[name] = {}
        sig = [
            str(e.get("profiling_name") or "?"),
            e.get("input_sizes") or [],
            e.get("output_sizes") or [],
            e.get("input_dtypes") or [],
        ]
        text = json.dumps(sig)
        index = tables[name].get(text)
        if index is None:
            index = tables[name][text] = len(group["table"])
            group["table"].append(sig)
        group["rows"].append((int(e.get("collective_seq_id") or 0), index, e))
    out = []
    for group in groups.values():
        rows = sorted(group.pop("rows"), key=lambda r: r[0])
        seqs = [r[0] for r in rows]
        if seqs and seqs[-1] - seqs[0] == len(seqs) - 1:
            group["seq_range"] = [seqs[0], len(seqs)]
        else:
            group["seqs"] = seqs
        group["keys"] = [r[1] for r in rows]
        last = rows[-1][2] if rows else {}
        group["last_state"] = str(last.get("state") or "")
        group["last_retired"] = bool(last.get("retired"))
        out.append(group)
    rank = data.get("rank")
    return {
        "rank": rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        "version": data.get("version"),
        "pg_config": data.get("pg_config") or {},
        "pg_status": data.get("pg_status") or {},
        "groups": out,
    }


def _post(
    path: str, url: str, uid: int, deadline: float, pid: int | None = None
) -> tuple[int, bytes]:
    """POST `url` on the Unix socket `path`, all of it (connect, request, reply) before
    `deadline` (time.monotonic()): a server that trickles its reply runs out of time, not a
    per-read timeout. The peer must run as `uid` and, given `pid`, be that process (the
    listener's credentials, SO_PEERCRED)."""
    import http.client
    import socket

    from areal_node.agent.rank_socket import peer_problem

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete reply before the deadline")
        return left

    class DeadlineSocket(socket.socket):
        def recv_into(self, *a: Any, **k: Any) -> int:
            self.settimeout(remaining())
            try:
                return super().recv_into(*a, **k)
            except TimeoutError:
                raise TimeoutError("no complete reply before the deadline") from None

        def recv(self, *a: Any, **k: Any) -> bytes:
            self.settimeout(remaining())
            try:
                return super().recv(*a, **k)
            except TimeoutError:
                raise TimeoutError("no complete reply before the deadline") from None

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = DeadlineSocket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(remaining())
                sock.connect(path)
                problem = peer_problem(sock, uid, pid)
                if problem is not None:
                    raise PermissionError(problem)
            except BaseException:
                sock.close()
                raise
            self.sock = sock

    conn = UnixConnection("localhost", timeout=remaining())
    try:
        conn.request("POST", url, body=b"", headers={"Content-Length": "0"})
        reply = conn.getresponse()
        body = reply.read(FR_MAX_BYTES + 1)
        if len(body) > FR_MAX_BYTES:
            raise ValueError(f"reply larger than {FR_MAX_BYTES} bytes: not a trace")
        return reply.status, body
    finally:
        conn.close()


def _listening_unix_paths(
    pid: int, tables: dict[str, dict[str, str]] | None = None
) -> dict[str, str]:
    """The Unix sockets listening at a path in process `pid`'s network namespace: inode ->
    path. `tables` keeps them per namespace for one request: the ranks of a job share
    one, and on a GPU node the table holds thousands of sockets."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        namespace = None
    if tables is not None and namespace is not None and namespace in tables:
        return tables[namespace]
    table = read_all(f"/proc/{pid}/net/unix").decode("utf-8", "surrogateescape")
    listening = {}
    for line in table.splitlines()[1:]:
        # Num RefCount Protocol Flags Type St Inode Path; Flags 0x10000 = listening
        fields = line.split(None, 7)
        if len(fields) == 8 and int(fields[3], 16) & 0x10000:
            listening[fields[6]] = fields[7]
    if tables is not None and namespace is not None:
        tables[namespace] = listening
    return listening


def _listening_unix_sockets(
    pid: int, wanted: Callable[[str], bool], tables: dict[str, dict[str, str]] | None = None
) -> set[str]:
    """The paths `wanted` accepts among the Unix sockets process `pid` itself listens on:
    its open socket inodes matched against its network namespace's socket table. A socket
    file someone else bound at a name the rank would use is not among them. The process's
    descriptors are read only when some listening path is wanted (most ranks: none)."""
    candidates = {
        inode: path for inode, path in _listening_unix_paths(pid, tables).items() if wanted(path)
    }
    if not candidates:
        return set()
    paths = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except PermissionError:
            raise  # another user's process without CAP_SYS_PTRACE: see `fr_sockets`
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]") and target[8:-1] in candidates:
            paths.add(candidates[target[8:-1]])
    return paths


def process_uid(pid: int) -> int:
    """The user a process runs as (the owner of its /proc entry)."""
    return os.stat(f"/proc/{pid}").st_uid


def fr_sockets(
    pid: int, env: dict[str, str], tables: dict[str, dict[str, str]] | None = None
) -> list[str]:
    """The sockets a rank's trace can be asked at: our launch hook's `areal-fr-<pid>.sock`
    (in a private directory, see the hook) or torch's `TORCH_WORKER_SERVER_SOCKET`, each
    only if this very process listens on it and the file is a socket owned by its user.
    Planted names and an environment naming another user's socket are never asked.
    `tables`: the socket tables already read by this request, per network namespace.

    Where the process's descriptors cannot be read (another user's process, and this
    agent without CAP_SYS_PTRACE), the listening paths of its namespace's table are
    returned: `_post` then asks only if the listener's own credentials (SO_PEERCRED) name
    this very process, before a byte is sent."""
    wanted = f"areal-fr-{pid}.sock"
    named = env.get("TORCH_WORKER_SERVER_SOCKET")

    def want(path: str) -> bool:
        return os.path.basename(path) == wanted or path == named

    try:
        uid = process_uid(pid)
        try:
            listening = _listening_unix_sockets(pid, want, tables)
        except PermissionError:
            listening = {p for p in _listening_unix_paths(pid, tables).values() if want(p)}
    except OSError:
        return []
    found = sorted(p for p in listening if os.path.basename(p) == wanted)
    if named and named in listening and named not in found:
        found.append(named)
    trusted = []
    for path in found:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == uid:
            trusted.append(path)
    return trusted


def fr_live(
    pid: int, env: dict[str, str], timeout: float, sockets: list[str] | None = None
) -> dict[str, Any]:
    """Ask a rank's worker server for its trace (at `sockets`, by default all it has),
    within `timeout` seconds for the whole exchange. Never raises: a rank that does not
    answer, or answers with something that is not a trace, is this rank's error."""
    deadline = time.monotonic() + timeout
    errors = []
    malformed = False
    try:
        uid = process_uid(pid)
    except OSError as exc:
        return {"ok": False, "error": f"process gone: {exc}"}
    for path in fr_sockets(pid, env) if sockets is None else sockets:
        for handler in ("areal_fr_trace", "fr_trace_json"):
            try:
                status, body = _post(path, f"/handler/{handler}", uid, deadline, pid)
            except Exception as exc:  # one rank's failure, whatever it is
                errors.append(f"{path}: {type(exc).__name__}: {str(exc)[:200]}")
                break
            if status == 200:
                try:
                    return {"ok": True, "socket": path, "trace": decode_live(body)}
                except TraceDumpError as exc:
                    malformed = True
                    errors.append(f"{path} {handler}: {exc}")
            else:
                errors.append(f"{path} {handler}: HTTP {status}")
    if not errors:
        return {"ok": False, "error": "no Flight Recorder socket (recorder access not enabled)"}
    reply: dict[str, Any] = {"ok": False, "error": "; ".join(errors)}
    if malformed:
        reply["kind"] = "malformed"
    return reply


def _read_dump(path: str, owners: set[int], since: float | None) -> dict[str, Any]:
    """One dump file as a record: trusted only if it is a regular file owned by one of the
    job's users, opened by the node's guarded reader (no link followed, never blocking on a
    FIFO, checked on the open descriptor)."""
    try:
        dump = open_regular(path, owners, FR_MAX_BYTES)
    except OSError as exc:
        return {"ok": False, "kind": "untrusted", "error": f"not opened: {exc.strerror}"}
    except Refused as exc:
        return _refused_dump(exc, owners, since)
    record: dict[str, Any] = {"mtime": dump.st.st_mtime}
    with dump:
        if since is not None and dump.st.st_mtime < since:
            return {**record, "ok": False, "stale": True, "error": "older than the job's processes"}
        try:
            return {**record, "ok": True, "trace": decode_dump(dump.read())}
        except Refused as exc:
            return _refused_dump(exc, owners, since)
        except TraceDumpError as exc:
            return {**record, "ok": False, "kind": "malformed", "error": str(exc)}
        except OSError as exc:
            return {**record, "ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _refused_dump(exc: Refused, owners: set[int], since: float | None) -> dict[str, Any]:
    """The record of a dump the guarded reader refused, in the words dumps always had: a
    stale one is stale before it is too large."""
    st = exc.st
    record: dict[str, Any] = {} if st is None else {"mtime": st.st_mtime}
    if exc.reason == NOT_REGULAR:
        return {**record, "ok": False, "kind": "untrusted", "error": "not a regular file"}
    if exc.reason == OWNER and st is not None:
        who = ", ".join(str(u) for u in sorted(owners))
        error = f"owned by uid {st.st_uid}, not the job's user (uid {who})"
        return {**record, "ok": False, "kind": "untrusted", "error": error}
    if st is not None and since is not None and st.st_mtime < since:
        return {**record, "ok": False, "stale": True, "error": "older than the job's processes"}
    if exc.reason == TOO_LARGE:
        error = f"{exc.size} bytes: too large for a trace"
        return {**record, "ok": False, "kind": "malformed", "error": error}
    return {**record, "ok": False, "kind": "untrusted", "error": str(exc)}


def fr_dump_files(
    prefixes: list[str], since: float | None, owners: set[int] | None = None
) -> list[dict[str, Any]]:
    """Every `<prefix><rank>` file under the given prefixes, decoded safely: only files
    owned by `owners` (the job's users; by default this agent's user) are read."""
    owners = {os.getuid()} if owners is None else owners
    found = []
    seen = set()
    for prefix in prefixes:
        directory, stem = os.path.split(prefix)
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            tail = name[len(stem) :]
            if not name.startswith(stem) or not tail.isdigit() or len(tail) > 9:
                continue
            path = os.path.join(directory, name)
            if path in seen:
                continue
            seen.add(path)
            found.append({"path": path, "rank": int(tail), **_read_dump(path, owners, since)})
    return found


@op("fr_traces")
def op_fr_traces(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Flight Recorder traces of the given rank PIDs (live) and of dump files on this node."""
    pids = args.get("pids")
    if not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
        raise OpError("argument 'pids' must be a list of integers")
    extra = args.get("prefixes") or []
    if not isinstance(extra, list) or not all(isinstance(p, str) for p in extra):
        raise OpError("argument 'prefixes' must be a list of strings")
    timeout = arg(args, "timeout", float, 5.0)
    live = arg(args, "live", bool, True)
    envs: dict[int, dict[str, str]] = {}
    owners: set[int] = set()
    starts = []
    for pid in pids:
        try:
            envs[pid] = parse_environ(read_all(f"/proc/{pid}/environ"), FR_ENV)
            owners.add(process_uid(pid))
        except OSError:
            envs[pid] = {}
        ticks = start_ticks(pid)
        if ticks is not None:
            starts.append(ticks)
    prefixes = list(extra)
    for env in envs.values():
        for name in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
            if env.get(name):
                prefixes.append(env[name])
                break
        else:
            prefixes.append(FR_DEFAULT_PREFIX)
    if not prefixes:
        prefixes.append(FR_DEFAULT_PREFIX)
    since = boot_time() + min(starts) / CLK_TCK if starts else None
    ranks = []
    if live:
        # Only ranks with a socket are asked, each in a thread of its own (a rank that is
        # slow to answer must not hold up the others); the rest answer at once. Each
        # rank's exchange has its own deadline (`timeout`), so the op ends within it.
        tables: dict[str, dict[str, str]] = {}  # socket tables, one per network namespace
        sockets = {pid: fr_sockets(pid, envs[pid], tables) for pid in pids}
        asked = [pid for pid in pids if sockets[pid]]
        replies = parallel_map(lambda p: fr_live(p, envs[p], timeout, sockets[p]), asked, 32)
        answers = dict(zip(asked, replies))
        for pid in pids:
            reply = answers[pid] if pid in answers else fr_live(pid, envs[pid], timeout, [])
            rank = to_int(envs[pid].get("RANK"))
            if rank is None and reply.get("ok"):
                # an AReaL rpc_server learns its rank after start (POST /set_env): the
                # hook's reply carries the rank known when it answered
                rank = reply["trace"].get("rank")
            ranks.append({"pid": pid, "rank": rank, **reply})
    return {
        "live": ranks,
        "files": fr_dump_files(list(dict.fromkeys(prefixes)), since, owners or None),
        "prefixes": list(dict.fromkeys(prefixes)),
    }
