"""AReaL's name-resolve records of one job, read the way AReaL writes them.

Every rpc_server registers `{user}/{experiment}/{trial}/workers/{role}/{index}` ->
`host:port` (areal/infra/rpc/guard/app.py:618-625, areal/utils/names.py:33-34 at AReaL
cbff54d6); rollout launchers add `{user}/{experiment}/{trial}/gen_servers/{id}`
(names.py:25-26, name_resolve.py:82-90). Two backends are read here:

- nfs: one directory per name under the record root with the value in its `ENTRY`
  file, written to `ENTRY.tmp.<id>` and renamed (name_resolve.py:286-326). The default
  root is `/tmp/areal/name_resolve` (guard/app.py:523-526), where anyone can plant a
  tree: an entry counts only when its `ENTRY` file is a regular file owned by the job's
  user, opened without following links, read with a size bound.
- etcd3: the same names as keys (normalised paths, name_resolve.py:511-534), read through
  etcd's v3 HTTP/JSON gateway (`POST /v3/kv/range`) with the standard library. etcd has
  no per-key owner: whoever may write to that etcd is trusted, as AReaL trusts it.

The Ray KV actor backend is not read here.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import pwd
import stat
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Protocol

from areal_console.core.errors import UsageError, UserError
from areal_console.core.textfmt import clip_repr

DEFAULT_NFS_ROOT = "/tmp/areal/name_resolve"
ENTRY_FILE = "ENTRY"
MAX_VALUE_BYTES = 4096  # a value is `host:port`; anything longer is not AReaL's
MAX_ENTRIES = 100_000  # bound on one job's records (and on a listing)
MAX_DIRS = 4 * MAX_ENTRIES  # bound on the directories walked (a planted maze ends here)
ETCD_TIMEOUT = 5.0


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
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
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


class Registry(Protocol):
    """A name-resolve backend, read-only."""

    source: str

    def job(self, name: JobName) -> JobRecords: ...

    def trials(self, user: str) -> list[str]: ...

    def users_with(self, experiment: str, trial: str) -> list[str]: ...


# --------------------------------------------------------------------------------------
# nfs


def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if user.isdigit() else None


def _user_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class NfsRegistry:
    """Records under an nfs record root, read on this machine."""

    def __init__(self, root: str = DEFAULT_NFS_ROOT) -> None:
        self.root = os.path.normpath(os.path.expanduser(root))
        self.source = f"nfs:{self.root}"
        self._check_root()

    def _check_root(self) -> None:
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return  # no record at all: "no AReaL job ... (found: none)"
        except OSError as exc:
            raise UserError(f"cannot read name-resolve root {self.root}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UserError(f"name-resolve root {self.root} is not a directory")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise UserError(f"cannot read name-resolve root {self.root}: permission denied")

    def _list(self, path: str) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(path) as it:
                return list(it)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None

    def job(self, name: JobName) -> JobRecords:
        records = JobRecords(name, self.source)
        uid = _uid_of(name.user)
        top = os.path.join(self.root, name.user, name.experiment, name.trial)
        stack = [top]
        seen = dirs = 0
        while stack and seen < MAX_ENTRIES and dirs < MAX_DIRS:
            dirs += 1
            for item in self._list(stack.pop()):
                if item.is_dir(follow_symlinks=False):  # never a link out of the root
                    stack.append(item.path)
                elif item.name == ENTRY_FILE:
                    seen += 1
                    self._read_entry(records, item.path, uid)
        records.entries.sort(key=_sort_key)
        return records

    def _read_entry(self, records: JobRecords, path: str, uid: int | None) -> None:
        key = os.path.dirname(path)[len(self.root) + 1 :]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            records.refused.append(f"{key}: cannot open ENTRY ({exc.strerror})")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                records.refused.append(f"{key}: ENTRY is not a regular file")
                return
            if uid is None or st.st_uid != uid:
                records.refused.append(
                    f"{key}: ENTRY owned by {_user_of(st.st_uid)}, not {records.name.user}"
                )
                return
            data = os.read(fd, MAX_VALUE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_VALUE_BYTES:
            records.refused.append(f"{key}: ENTRY larger than {MAX_VALUE_BYTES} bytes")
            return
        value = data.decode("utf-8", "replace").strip()
        owner = records.name.user
        records.entries.append(make_entry(records.name.key, key, value, owner))

    def trials(self, user: str) -> list[str]:
        out = []
        for exp in self._list(os.path.join(self.root, user)):
            if exp.is_dir(follow_symlinks=False):
                out += [f"{exp.name}/{t.name}" for t in self._list(exp.path) if t.is_dir()]
        return sorted(out)[:MAX_ENTRIES]

    def users_with(self, experiment: str, trial: str) -> list[str]:
        users = self._list(self.root)
        return sorted(
            u.name
            for u in users
            if u.is_dir(follow_symlinks=False)
            and os.path.isdir(os.path.join(u.path, experiment, trial))
        )


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
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"etcd3 at {self.address}: not an etcd v3 answer") from None

    def job(self, name: JobName) -> JobRecords:
        records = JobRecords(name, self.source)
        prefix = name.key + "/"
        for key, value in self._range(prefix, prefix_end(prefix), keys_only=False):
            if len(value) > MAX_VALUE_BYTES:
                records.refused.append(f"{key}: value larger than {MAX_VALUE_BYTES} bytes")
                continue
            records.entries.append(make_entry(name.key, key, value.strip()))
        records.entries.sort(key=_sort_key)
        return records

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
                f"that name: {', '.join(others)} (give USER/{name.short})"
            )
    found = registry.trials(name.user)
    listing = ", ".join(found[:20]) + (f", ... ({len(found)} in all)" if len(found) > 20 else "")
    raise UserError(f"no AReaL job {name.short} under {where} (found: {listing or 'none'})")
