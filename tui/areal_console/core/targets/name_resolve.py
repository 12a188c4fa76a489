"""AReaL's name-resolve records of one job, read the way AReaL writes them.

Every rpc_server registers `{user}/{experiment}/{trial}/workers/{role}/{index}` ->
`host:port` (areal/infra/rpc/guard/app.py:618-625, areal/utils/names.py:33-34 at AReaL
cbff54d6); rollout launchers add `{user}/{experiment}/{trial}/gen_servers/{id}`
(names.py:25-26, name_resolve.py:82-90). Two backends are read here:

- nfs: one directory per name under the record root with the value in its `ENTRY`
  file, written to `ENTRY.tmp.<id>` and renamed (name_resolve.py:286-326). The default
  root is `/tmp/areal/name_resolve` (guard/app.py:523-526), where anyone can plant a
  tree: an entry counts only when its `ENTRY` file is a regular file owned by the job's
  user, opened without following links, read with a size bound. The reader is the node
  package's (areal_node.name_resolve): here for a root this machine sees, through a
  node's agent (`--name-resolve-via NODE`) for a root only that node sees.
- etcd3: the same names as keys (normalised paths, name_resolve.py:511-534), read through
  etcd's v3 HTTP/JSON gateway (`POST /v3/kv/range`) with the standard library. etcd has
  no per-key owner: whoever may write to that etcd is trusted, as AReaL trusts it.

The Ray KV actor backend is read by `ray_name_resolve.py` (it needs `ray`).
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from areal_node import name_resolve as nfs
from areal_node.name_resolve import DEFAULT_NFS_ROOT, MAX_ENTRIES, MAX_VALUE_BYTES

from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.common.textfmt import clip, clip_repr
from areal_console.core.targets.specs import is_host

ETCD_TIMEOUT = 5.0
MAX_KEY_CHARS = 1024


@dataclass(frozen=True)
class JobName:
    """`USER/EXPERIMENT/TRIAL`: how AReaL keys a job's records (names.py:21-22)."""

    user: str
    experiment: str
    trial: str
    user_given: bool = True

    @property
    def key(self) -> str:
        return f"{self.user}/{self.experiment}/{self.trial}"

    @property
    def short(self) -> str:
        return f"{self.experiment}/{self.trial}"

    @property
    def slurm_prefix(self) -> str:
        """AReaL's Slurm scheduler names each role's job `{experiment}_{trial}:{role}`
        (areal/infra/scheduler/slurm.py:165-166)."""
        return f"{self.experiment}_{self.trial}:"


def current_user() -> str:
    """The user name AReaL keys records by: `getpass.getuser()` (names.py:10)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def parse_job_name(text: str, default_user: str | None = None) -> JobName:
    """`EXPERIMENT/TRIAL` (the current user's) or `USER/EXPERIMENT/TRIAL`."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or any(p in ("", ".", "..") or "\0" in p for p in parts):
        raise UsageError(
            f"--areal: expected EXPERIMENT/TRIAL or USER/EXPERIMENT/TRIAL, got {clip_repr(text)}"
        )
    if len(parts) == 3:
        return JobName(parts[0], parts[1], parts[2], user_given=True)
    return JobName(default_user or current_user(), parts[0], parts[1], user_given=False)


@dataclass(frozen=True)
class NameEntry:
    """One record of the job: a worker (`role`, `index`) or an inference server."""

    key: str
    value: str
    kind: str  # "worker", "gen_server" or "other"
    role: str | None = None
    index: int | None = None
    host: str | None = None
    port: int | None = None
    owner: str | None = None  # nfs: the ENTRY file's owner; etcd3: None

    @property
    def label(self) -> str:
        if self.kind == "worker":
            return f"{self.role}/{self.index}"
        return self.key.split("/", 3)[-1]


@dataclass
class JobRecords:
    """What the backend holds for one job: the trusted entries, and those refused."""

    name: JobName
    source: str
    entries: list[NameEntry] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def split_hostport(value: str) -> tuple[str, int] | None:
    """`host:port` or `[v6]:port` as AReaL writes it (areal/utils/network.py:81-103)."""
    if value.startswith("["):
        host, close, rest = value[1:].partition("]")
        port = rest[1:] if close and rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, port = value.split(":")
    else:
        return None
    if not is_host(host) or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None  # a record's host goes to SSH and the probe: a name or an IP, nothing else
    return host, int(port)


def make_entry(job_key: str, key: str, value: str, owner: str | None = None) -> NameEntry:
    """The record `key` -> `value` of the job `job_key`, typed."""
    rest = key[len(job_key) :].strip("/").split("/")
    address = split_hostport(value)
    host, port = address if address else (None, None)
    if len(rest) == 3 and rest[0] == "workers":
        index = int(rest[2]) if rest[2].isdigit() else None
        return NameEntry(key, value, "worker", rest[1], index, host, port, owner)
    kind = "gen_server" if rest[0] == "gen_servers" else "other"
    return NameEntry(key, value, kind, None, None, host, port, owner)


def _sort_key(e: NameEntry) -> tuple[Any, ...]:
    return (e.kind != "worker", e.role or "", e.index if e.index is not None else -1, e.key)


def records_from_pairs(name: JobName, source: str, pairs: Iterable[tuple[str, str]]) -> JobRecords:
    """A job's records from a key-value backend's (key, value) pairs (etcd3, Ray's KV):
    a value over MAX_VALUE_BYTES is refused, the rest become entries, workers first."""
    records = JobRecords(name, source)
    for key, value in pairs:
        # Neither etcd nor Ray's KV has an owner per key: a pair outside the job's prefix
        # (an actor of that name that another user made answers what it likes) or with a
        # key longer than any name AReaL writes is no record of the job.
        if not key.startswith(name.key + "/") or len(key) > MAX_KEY_CHARS:
            records.refused.append(f"{clip_repr(key, 120)}: not a key of {name.key}")
            continue
        if len(value) > MAX_VALUE_BYTES:
            records.refused.append(f"{key}: value larger than {MAX_VALUE_BYTES} bytes")
            continue
        records.entries.append(make_entry(name.key, key, value.strip()))
    records.entries.sort(key=_sort_key)
    return records


class Registry(Protocol):
    """A name-resolve backend, read-only."""

    source: str

    def job(self, name: JobName) -> JobRecords: ...

    def trials(self, user: str) -> list[str]: ...

    def users_with(self, experiment: str, trial: str) -> list[str]: ...


# --------------------------------------------------------------------------------------
# nfs


class NfsRegistry:
    """Records under an nfs record root, read on this machine (node package's reader)."""

    def __init__(self, root: str = DEFAULT_NFS_ROOT) -> None:
        self.root = os.path.normpath(os.path.expanduser(root))
        self.source = f"nfs:{self.root}"
        try:
            nfs.check_root(self.root)
        except nfs.RootError as exc:
            raise UserError(str(exc)) from None

    def job(self, name: JobName) -> JobRecords:
        try:
            found = nfs.read_job(self.root, name.user, name.experiment, name.trial)
        except nfs.RootError as exc:
            raise UserError(str(exc)) from None
        return typed_records(name, self.source, found)

    def trials(self, user: str) -> list[str]:
        try:
            return nfs.trials(self.root, user)
        except nfs.RootError as exc:
            raise UserError(str(exc)) from None

    def users_with(self, experiment: str, trial: str) -> list[str]:
        try:
            return nfs.users_with(self.root, experiment, trial)
        except nfs.RootError as exc:
            raise UserError(str(exc)) from None


class NodeNfsRegistry:
    """Records under an nfs record root that only a cluster node sees, read by that
    node's agent (op `name_resolve`, the same reader): `--name-resolve-via NODE`.

    `call(op, args)` asks the node's agent; one answer per job carries its entries and,
    where it has none, the user's jobs and the users with that name."""

    def __init__(self, node: str, root: str, call: Callable[[str, dict[str, Any]], Any]) -> None:
        self.node = node
        self.root = os.path.normpath(root)
        self.source = f"nfs:{node}:{self.root}"
        self._call = call
        self._answers: dict[tuple[str, str, str], dict[str, Any]] = {}

    def _lookup(self, name: JobName) -> dict[str, Any]:
        key = (name.user, name.experiment, name.trial)
        if key not in self._answers:
            args = {"root": self.root, "user": key[0], "experiment": key[1], "trial": key[2]}
            found = self._call("name_resolve", args)
            if not isinstance(found, dict) or not isinstance(found.get("entries"), list):
                raise UserError(f"--name-resolve-via {self.node}: not a name_resolve answer")
            if not found.get("exists"):
                raise UserError(f"name-resolve root {self.root} does not exist on {self.node}")
            self._answers[key] = found
        return self._answers[key]

    def job(self, name: JobName) -> JobRecords:
        return typed_records(name, self.source, self._lookup(name))

    def trials(self, user: str) -> list[str]:
        found: set[str] = set()
        for (u, _, _), answer in self._answers.items():
            if u == user:
                found.update(str(t) for t in answer.get("trials", []))
        return sorted(found)

    def users_with(self, experiment: str, trial: str) -> list[str]:
        found: set[str] = set()
        for (_, e, t), answer in self._answers.items():
            if (e, t) == (experiment, trial):
                found.update(str(u) for u in answer.get("users", []))
        return sorted(found)


def typed_records(name: JobName, source: str, found: dict[str, Any]) -> JobRecords:
    """The node reader's answer (`{"entries": [{"key", "value", "owner"}], "refused"}`)
    as the job's typed records, workers first."""
    records = JobRecords(name, source, refused=[str(r) for r in found.get("refused", [])])
    for item in found.get("entries", []):
        key, value = str(item["key"]), str(item["value"])
        records.entries.append(make_entry(name.key, key, value, item.get("owner")))
    records.entries.sort(key=_sort_key)
    return records


# --------------------------------------------------------------------------------------
# etcd3


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def prefix_end(prefix: str) -> bytes:
    """etcd's range end for "every key starting with `prefix`"."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


class EtcdRegistry:
    """Records in etcd, through its v3 HTTP/JSON gateway (`etcd3_addr` = host:port)."""

    def __init__(self, address: str, timeout: float = ETCD_TIMEOUT) -> None:
        addr = address.strip().rstrip("/")
        if addr.startswith("https://"):
            raise UsageError("--etcd3: only plain http is supported (as AReaL's client uses)")
        addr = addr.removeprefix("http://")
        if split_hostport(addr) is None:
            raise UsageError(f"--etcd3: expected HOST:PORT, got {clip_repr(address)}")
        self.address = addr
        self.url = f"http://{addr}/v3/kv/range"
        self.timeout = timeout
        self.source = f"etcd3:{addr}"

    def _range(self, key: bytes | str, end: bytes, keys_only: bool) -> list[tuple[str, str]]:
        body: dict[str, Any] = {"key": _b64(key), "range_end": _b64(end), "limit": MAX_ENTRIES}
        if keys_only:
            body["keys_only"] = True
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read(64 * 1024 * 1024)
        except urllib.error.HTTPError as exc:
            raise UserError(f"etcd3 at {self.address}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UserError(f"etcd3 at {self.address}: cannot connect ({reason})") from None
        try:
            doc = json.loads(raw)
            kvs = doc.get("kvs", []) if isinstance(doc, dict) else None
            if not isinstance(kvs, list):
                raise ValueError("no kvs")
            return [
                (
                    base64.b64decode(kv["key"]).decode("utf-8", "replace"),
                    base64.b64decode(kv.get("value", "")).decode("utf-8", "replace"),
                )
                for kv in kvs
            ]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise UserError(f"etcd3 at {self.address}: not an etcd v3 answer") from None

    def job(self, name: JobName) -> JobRecords:
        prefix = name.key + "/"
        pairs = self._range(prefix, prefix_end(prefix), keys_only=False)
        return records_from_pairs(name, self.source, pairs)

    def trials(self, user: str) -> list[str]:
        prefix = user + "/"
        found = {
            "/".join(parts[1:3])
            for key, _ in self._range(prefix, prefix_end(prefix), keys_only=True)
            if len(parts := key.split("/")) > 3
        }
        return sorted(found)

    def users_with(self, experiment: str, trial: str) -> list[str]:
        found = {
            parts[0]
            for key, _ in self._range(b"\0", b"\0", keys_only=True)
            if len(parts := key.split("/")) > 3 and parts[1:3] == [experiment, trial]
        }
        return sorted(found)


# --------------------------------------------------------------------------------------


def open_registry(nfs_root: str | None = None, etcd3: str | None = None) -> Registry:
    """The backend the options name: etcd3 when an address is given, else nfs."""
    if etcd3:
        return EtcdRegistry(etcd3)
    return NfsRegistry(nfs_root or DEFAULT_NFS_ROOT)


def find_job(registry: Registry, name: JobName) -> JobRecords:
    """The job's records; a `UserError` naming what exists when there are none."""
    records = registry.job(name)
    if records.entries:
        return records
    where = (
        registry.source.split(":", 1)[1]
        if registry.source.startswith("nfs:")
        else (registry.source)
    )
    if records.refused:
        raise UserError(
            f"AReaL job {name.key} under {where}: no entry to trust "
            f"({'; '.join(records.refused[:3])})"
        )
    if not name.user_given:
        others = [u for u in registry.users_with(name.experiment, name.trial) if u != name.user]
        if others:
            raise UserError(
                f"no AReaL job {name.short} of user {name.user} under {where}; users with "
                f"that name: {', '.join(clip(u, 80) for u in others[:20])} (give USER/{name.short})"
            )
    found = registry.trials(name.user)
    listing = ", ".join(clip(t, 200) for t in found[:20]) + (
        f", ... ({len(found)} in all)" if len(found) > 20 else ""
    )
    raise UserError(f"no AReaL job {name.short} under {where} (found: {listing or 'none'})")
