"""Reading /proc: raw reads, `stat` and `environ` parsing, and the process table sampler."""

from __future__ import annotations

import os
import stat
import time
from typing import Any

from areal_node.launcher import as_module_argv

# Environment variables that identify a rank of a distributed job (and AReaL's mode).
RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    # Ranks set by other launchers: Slurm (`srun python ...`), Open MPI, MPICH/Intel MPI.
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    # AReaL's SPMD launchers set it on the trainer (areal/infra/launcher/local.py:418 at
    # cbff54d): the console tells the job's mode, and so its capacity scaling, from it.
    "AREAL_SPMD_MODE",
)


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
YOUNG_SECONDS = 3.0
FULL_SAMPLE_EVERY = 10  # every Nth sample reads every process's stat again


def read_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes of an open file, read in chunks (procfs hands a table over a
    page or so per read; a regular file may be shorter than its size said)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


# Bounds on what the agent reads of another process and sends on: a command line or an
# environment may be megabytes (up to ARG_MAX), and any user can make one.
CMDLINE_READ_MAX = 64 << 10  # read and parsed (flags, -m module)
CMDLINE_SEND_MAX = (16 << 10) - 64  # sent, with "… (N more characters)" after it
ENVIRON_READ_MAX = 1 << 20  # read to find the rank variables
ENV_VALUE_MAX = 4096  # each rank variable's value kept


def read_capped(path: str, keep: int) -> tuple[bytes, int]:
    """The first `keep` bytes of `path`, and its whole length (the rest read in chunks
    and dropped, never held)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        size = 0
        while size < keep:
            chunk = os.read(fd, min(65536, keep - size))
            if not chunk:
                return b"".join(chunks), size
            chunks.append(chunk)
            size += len(chunk)
        total = size
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks), total
            total += len(chunk)
    finally:
        os.close(fd)


def cap_text(text: str, limit: int, more: int = 0) -> str:
    """`text` cut to `limit` characters, saying how many more there were (`more`: beyond
    `text`, never read)."""
    if len(text) <= limit and not more:
        return text
    cut = max(0, len(text) - limit) + more
    return f"{text[:limit]}… ({cut:,} more characters)"


def read_small(path: str) -> bytes:
    """A one-line /proc file (stat, statm): one read, unless it fills the buffer."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, 4096)
        if len(data) < 4096:
            return data
        chunks = [data]
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def parse_stat(raw: bytes) -> tuple[str, str, int, int, int]:
    """(comm, state, ppid, cpu_ticks, start_ticks) from /proc/PID/stat."""
    # comm may hold spaces and parentheses: split at the last ')'.
    close = raw.rindex(b")")
    comm = raw[raw.index(b"(") + 1 : close].decode(errors="replace")
    fields = raw[close + 2 :].split()
    state = fields[0].decode()
    ppid = int(fields[1])
    cpu_ticks = int(fields[11]) + int(fields[12])
    start_ticks = int(fields[19])
    return comm, state, ppid, cpu_ticks, start_ticks


def parse_environ(raw: bytes, wanted: tuple[str, ...] = RANK_VARS) -> dict[str, str]:
    """The `wanted` variables of a NUL-separated environment block, in the order they
    first appear (a name set twice: its last value, where it was first).

    Each name is searched for in C (`NUL NAME =` can only start an entry: no entry holds a
    NUL) instead of splitting and decoding the whole block in Python: a sample reads every
    process's environment, and this was two thirds of a one-shot capture's `sample`."""
    block = b"\0" + raw
    found: list[tuple[int, str, str]] = []
    for name in wanted:
        key = b"\0" + name.encode() + b"="
        at = block.rfind(key)
        if at < 0:
            continue
        start = at + len(key)
        end = block.find(b"\0", start)
        value = block[start : end if end >= 0 else len(block)][:ENV_VALUE_MAX]
        found.append((block.find(key), name, value.decode(errors="replace")))
    return {name: value for _, name, value in sorted(found)}


def to_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def start_ticks(pid: int) -> int | None:
    try:
        return parse_stat(read_all(f"/proc/{pid}/stat"))[4]
    except (OSError, ValueError, IndexError):
        return None


STDOUT_PATH_MAX = 4096


def stdout_path(proc_dir: str, uid: int | None) -> str | None:
    """Where `proc_dir`'s fd 1 points, when it is a regular file still linked and owned by
    `uid` (the process's user); only /proc is read: stat through the descriptor's link
    (the open file itself, whatever its path has become since) and the link's text."""
    if uid is None:
        return None
    link = proc_dir + "/fd/1"
    try:
        st = os.stat(link)
        path = os.readlink(link)
    except OSError:  # no fd 1, another user's process, gone
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink == 0 or st.st_uid != uid:
        return None
    if not path.startswith("/") or len(path) > STDOUT_PATH_MAX:
        return None
    return path


def boot_time() -> float:
    for line in read_all("/proc/stat").decode().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


class ProcessCollector:
    """Samples /proc. Static facts (cmdline, environ) are cached per (pid, start time)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        # pid -> (start ticks, cmdline, rank env, env error, first seen)
        self._static: dict[int, tuple[int, list[str], dict[str, str], str | None, float]] = {}
        self._cmdline_more: dict[int, int] = {}  # pid -> command line bytes not read
        self._uids: dict[int, int] = {}  # pid -> the uid that owns the process
        self._last_cpu: dict[int, tuple[int, int, float]] = {}  # pid -> (start, ticks, t)
        self._last_stat: dict[int, tuple[str, str, int, int, int]] = {}  # parse_stat's
        self._stdout: dict[int, tuple[int, str | None]] = {}  # pid -> (start, stdout file)
        self._boot_time = time.time()

    def _static_info(self, pid: int, start: int) -> tuple[list[str], dict[str, str], str | None]:
        cached = self._static.get(pid)
        now = time.monotonic()
        # A process caught between fork and exec still shows its parent's command line and
        # environment (torchrun's workers do this): re-read young processes until they settle.
        if cached and cached[0] == start and now - cached[4] > YOUNG_SECONDS:
            return cached[1], cached[2], cached[3]
        base = f"{self.proc_root}/{pid}"
        try:
            raw, total = read_capped(base + "/cmdline", CMDLINE_READ_MAX)
            cmdline = as_module_argv([a.decode(errors="replace") for a in raw.split(b"\0") if a])
        except OSError:
            cmdline, raw, total = [], b"", 0
        try:
            self._uids[pid] = os.stat(base).st_uid
        except OSError:
            self._uids.pop(pid, None)
        if total > len(raw):
            self._cmdline_more[pid] = total - len(raw)
        else:
            self._cmdline_more.pop(pid, None)
        env_error = None
        try:
            env = parse_environ(read_capped(base + "/environ", ENVIRON_READ_MAX)[0])
        except PermissionError:
            env, env_error = {}, "permission denied reading environ"
        except OSError:
            env = {}
        first_seen = cached[4] if cached and cached[0] == start else now
        self._static[pid] = (start, cmdline, env, env_error, first_seen)
        return cmdline, env, env_error

    def snapshot(self, watch: set[int] | None = None) -> dict[int, dict[str, Any]]:
        """Every process: pid -> basic facts (no filtering).

        With `watch`, a process seen before that is not in it (and is past its young
        seconds) keeps its last `stat` reading instead of a new one: no CPU%, its state and
        parent as last read. A 1 Hz sample then reads only the processes it reports."""
        now = time.monotonic()
        procs: dict[int, dict[str, Any]] = {}
        seen: set[int] = set()
        last_stat = self._last_stat
        for name in os.listdir(self.proc_root):
            if not name.isdigit():
                continue
            pid = int(name)
            known = last_stat.get(pid)
            if watch is not None and known is not None and pid not in watch:
                cached = self._static.get(pid)
                if cached is not None and now - cached[4] > YOUNG_SECONDS:
                    seen.add(pid)
                    procs[pid] = {
                        "pid": pid,
                        "ppid": known[2],
                        "comm": known[0],
                        "state": known[1],
                        "cmdline": cached[1],
                        "env": cached[2],
                        "env_error": cached[3],
                        "cmdline_more": self._cmdline_more.get(pid, 0),
                        "uid": self._uids.get(pid),
                        "cpu_percent": None,
                    }
                    continue
            try:
                stat = parse_stat(read_small(f"{self.proc_root}/{pid}/stat"))
            except (OSError, ValueError, IndexError):
                continue
            comm, state, ppid, ticks, start = stat
            last_stat[pid] = stat
            seen.add(pid)
            cmdline, env, env_error = self._static_info(pid, start)
            prev = self._last_cpu.get(pid)
            cpu_percent: float | None = None
            if prev and prev[0] == start and now > prev[2]:
                cpu_percent = round(100.0 * (ticks - prev[1]) / CLK_TCK / (now - prev[2]), 1)
            self._last_cpu[pid] = (start, ticks, now)
            procs[pid] = {
                "pid": pid,
                "ppid": ppid,
                "comm": comm,
                "state": state,
                "cmdline": cmdline,
                "env": env,
                "env_error": env_error,
                "cmdline_more": self._cmdline_more.get(pid, 0),
                "uid": self._uids.get(pid),
                "cpu_percent": cpu_percent,
            }
        for gone in set(last_stat) - seen:
            self._static.pop(gone, None)
            self._cmdline_more.pop(gone, None)
            self._uids.pop(gone, None)
            self._last_cpu.pop(gone, None)
            self._stdout.pop(gone, None)
            last_stat.pop(gone, None)
        return procs

    def stdout_file(self, pid: int) -> str | None:
        """The file a process writes its standard output to (`train.py > run.log`, a
        launcher's log), read once per process (again while it is young): the path of
        /proc/PID/fd/1 when that is a regular file, still linked, owned by the process's
        own user. A pipe, a terminal, a deleted file or another user's file is None."""
        cached = self._static.get(pid)
        if cached is None:
            return None
        start = cached[0]
        known = self._stdout.get(pid)
        if known is not None and known[0] == start and time.monotonic() - cached[4] > YOUNG_SECONDS:
            return known[1]
        path = stdout_path(f"{self.proc_root}/{pid}", self._uids.get(pid))
        self._stdout[pid] = (start, path)
        return path

    def rss(self, pid: int) -> int | None:
        try:
            return int(read_small(f"{self.proc_root}/{pid}/statm").split()[1]) * PAGE_SIZE
        except (OSError, ValueError, IndexError):
            return None
