"""Flight Recorder traces (the collective ledger): live from a rank's worker server, or
from the dump files torch (NCCL on timeout) or our launch hook (gloo on a fatal error)
wrote. Dumps are pickles: decoded with an unpickler that builds only plain containers.
"""

from __future__ import annotations

import json
import os
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

if TYPE_CHECKING:
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
FR_MAX_BYTES = 256 << 20


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
    return {
        "version": data.get("version"),
        "pg_config": data.get("pg_config") or {},
        "pg_status": data.get("pg_status") or {},
        "groups": out,
    }


def _unix_post(path: str, url: str, timeout: float) -> tuple[int, bytes]:
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(path)
            self.sock = sock

    conn = UnixConnection("localhost", timeout=timeout)
    try:
        conn.request("POST", url, body=b"", headers={"Content-Length": "0"})
        reply = conn.getresponse()
        body = reply.read(FR_MAX_BYTES + 1)
        if len(body) > FR_MAX_BYTES:
            raise ValueError(f"reply larger than {FR_MAX_BYTES} bytes: not a trace")
        return reply.status, body
    finally:
        conn.close()


def fr_sockets(pid: int, env: dict[str, str]) -> list[str]:
    """The sockets a rank's trace can be asked at (our launch hook's, or torch's
    `worker_main`) that exist now."""
    dirs = (env.get("AREAL_FR_SOCKET_DIR"), env.get("TMPDIR"), "/tmp")
    sockets = list(dict.fromkeys(os.path.join(d, f"areal-fr-{pid}.sock") for d in dirs if d))
    if env.get("TORCH_WORKER_SERVER_SOCKET"):
        sockets.append(env["TORCH_WORKER_SERVER_SOCKET"])
    return [path for path in sockets if os.path.exists(path)]


def fr_live(
    pid: int, env: dict[str, str], timeout: float, sockets: list[str] | None = None
) -> dict[str, Any]:
    """Ask a rank's worker server for its trace (at `sockets`, by default all it has)."""
    errors = []
    for path in fr_sockets(pid, env) if sockets is None else sockets:
        for handler in ("areal_fr_trace", "fr_trace_json"):
            try:
                status, body = _unix_post(path, f"/handler/{handler}", timeout)
            except (OSError, ValueError) as exc:
                errors.append(f"{path}: {exc}")
                break
            if status == 200:
                try:
                    return {"ok": True, "socket": path, "trace": slim_trace(json.loads(body))}
                except ValueError as exc:
                    errors.append(f"{path} {handler}: {exc}")
            else:
                errors.append(f"{path} {handler}: HTTP {status}")
    if not errors:
        return {"ok": False, "error": "no Flight Recorder socket (recorder access not enabled)"}
    return {"ok": False, "error": "; ".join(errors)}


def fr_dump_files(prefixes: list[str], since: float | None) -> list[dict[str, Any]]:
    """Every `<prefix><rank>` file under the given prefixes, decoded safely."""
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
            if not name.startswith(stem) or not tail.isdigit():
                continue
            path = os.path.join(directory, name)
            if path in seen:
                continue
            seen.add(path)
            record: dict[str, Any] = {"path": path, "rank": int(tail)}
            try:
                st = os.stat(path)
                record["mtime"] = st.st_mtime
                if since is not None and st.st_mtime < since:
                    record.update(ok=False, stale=True, error="older than the job's processes")
                elif st.st_size > FR_MAX_BYTES:
                    record.update(ok=False, error=f"{st.st_size} bytes: too large for a trace")
                else:
                    with open(path, "rb") as fh:
                        record.update(ok=True, trace=slim_trace(safe_unpickle(fh.read())))
            except Exception as exc:  # one bad file must not hide the others
                record.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            found.append(record)
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
    starts = []
    for pid in pids:
        try:
            envs[pid] = parse_environ(read_all(f"/proc/{pid}/environ"), FR_ENV)
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
        # slow to answer must not hold up the others); the rest answer at once.
        sockets = {pid: fr_sockets(pid, envs[pid]) for pid in pids}
        asked = [pid for pid in pids if sockets[pid]]
        replies = parallel_map(lambda p: fr_live(p, envs[p], timeout, sockets[p]), asked, 32)
        answers = dict(zip(asked, replies))
        for pid in pids:
            reply = answers[pid] if pid in answers else fr_live(pid, envs[pid], timeout, [])
            ranks.append({"pid": pid, "rank": to_int(envs[pid].get("RANK")), **reply})
    return {
        "live": ranks,
        "files": fr_dump_files(list(dict.fromkeys(prefixes)), since),
        "prefixes": list(dict.fromkeys(prefixes)),
    }
