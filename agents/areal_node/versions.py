"""What a rank runs on, read from files: its interpreter's packages, torch's build, the
NVIDIA driver, the OS, and AReaL's version and (from a source checkout) its git commit.

Nothing here imports torch, AReaL or any package it reports on, and nothing runs the
rank's interpreter: versions come from `*.dist-info/METADATA`, `torch/version.py` (read as
literals, never executed), a checkout's `.git`, `/proc/driver/nvidia` and `/etc/os-release`.
Standard library only, Python 3.9+. `OPS` lets an agent serve `versions` (the console
sends this module with the agent's `load` op).
"""

from __future__ import annotations

import ast
import contextvars
import glob
import json
import os
import re
import stat
from typing import Any

from areal_node.guarded_read import Refused, open_regular

# Distributions a bug report names (normalised as PEP 503 does).
WANTED = ("torch", "areal", "sglang", "vllm", "transformers", "ray", "flash-attn", "megatron-core")
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
# A rank's environment variables a report shows (values of secret-looking names masked).
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "AREAL_", "GLOO_", "SGLANG_", "VLLM_",
                "OMP_", "HF_", "WANDB_", "RAY_", "SLURM_JOB", "MASTER_", "NVIDIA_")  # fmt: skip
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)
MAX_FILE = 1 << 20
MAX_ENV = 128
MAX_DIRS = 256
# The user of the process whose files are read (None: the agent's own): the files a
# process names (its PYTHONPATH, argv[0], a checkout's .git) are trusted as its user's.
_PROCESS: contextvars.ContextVar[tuple[int, frozenset[int]] | None] = contextvars.ContextVar(
    "process_user", default=None
)
# A venv's pyvenv.cfg (another user's file). `[ \t]*`, not `\s*`: `^\s*` at each of
# 65,536 blank lines rescanned all the blank lines after it.
_CFG_VERSION = re.compile(r"^[ \t]*version(?:_info)?[ \t]*=[ \t]*(\d+\.\d+(?:\.\d+)?)", re.M)
_CFG_HOME = re.compile(r"^[ \t]*home[ \t]*=[ \t]*(.+)$", re.M)
_CFG_SYSTEM_SITE = re.compile(r"^[ \t]*include-system-site-packages[ \t]*=[ \t]*true", re.M | re.I)
_REF = re.compile(r"refs/(?:[\w+@-][\w.+@-]*/)*[\w+@-][\w.+@-]*")


def _read(path: str, limit: int = MAX_FILE, own_only: bool = False) -> str | None:
    """At most `limit` bytes of a regular file, or None. Read as the agent reads logs,
    through the node's guarded reader: symlinks followed only when root, the agent's user
    or the process's user owns them, opened `O_NOFOLLOW|O_NONBLOCK` (a FIFO never blocks),
    and only a file the process could open itself (its user's and groups' permissions on
    the file and on every directory above it; `own_only`: its user's own file only). A
    link that user planted to a root-only file, or a path it names there, reads nothing."""
    uid, groups = _user()
    try:
        with open_regular(path, (uid,) if own_only else None, links_of=(uid,)) as found:
            if not own_only and not _readable_by(uid, groups, found.path, found.st):
                return None
            return found.read(limit).decode("utf-8", "replace")
    except (OSError, Refused):
        return None


def _user() -> tuple[int, frozenset[int]]:
    """The uid and groups files are read for: the process's, else the agent's own."""
    found = _PROCESS.get()
    if found is not None:
        return found
    return os.getuid(), frozenset([os.getgid(), *os.getgroups()])


def _may(uid: int, groups: frozenset[int], st: os.stat_result, bits: tuple[int, int, int]) -> bool:
    """Whether `uid` (in `groups`) has the permission `bits` (user, group, other) on a file
    as the kernel checks it (root always)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & bits[0])
    if st.st_gid in groups:
        return bool(st.st_mode & bits[1])
    return bool(st.st_mode & bits[2])


_READ = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)
_SEARCH = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


def _readable_by(uid: int, groups: frozenset[int], real: str, st: os.stat_result) -> bool:
    """Whether the user could open the file itself: read permission on it and search
    permission on every directory above it (ACLs aside)."""
    if not _may(uid, groups, st, _READ):
        return False
    parent = os.path.dirname(real)
    while True:
        try:
            dst = os.stat(parent)
        except OSError:
            return False
        if not _may(uid, groups, dst, _SEARCH):
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def _read_git(path: str, limit: int = 4096) -> str | None:
    """A file of a checkout's `.git`: only the process's own (or the agent's) user's."""
    return _read(path, limit, own_only=True)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_version_of(executable: str) -> str | None:
    """The interpreter's version from its files: a venv's `pyvenv.cfg`, the prefix's
    `patchlevel.h`, else X.Y from the `lib/pythonX.Y` next to it or the binary's name."""
    bindir = os.path.dirname(executable)
    cfg = _read(os.path.join(os.path.dirname(bindir), "pyvenv.cfg"), 64 << 10) or ""
    found = _CFG_VERSION.search(cfg)
    if found:
        return found.group(1)
    real = os.path.realpath(executable)
    prefix = os.path.dirname(os.path.dirname(real))
    for header in sorted(glob.glob(os.path.join(prefix, "include", "python3*", "patchlevel.h"))):
        text = _read(header, 64 << 10) or ""
        found = re.search(r'#define\s+PY_VERSION\s+"([^"]+)"', text)
        if found:
            return found.group(1)
    libs = sorted(glob.glob(os.path.join(prefix, "lib", "python3.*")))
    named = re.search(r"python(\d+\.\d+)", os.path.basename(real))
    if named:
        return named.group(1)
    if libs:
        return os.path.basename(libs[-1])[len("python") :]
    return None


def import_dirs(
    executable: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    argv: list[str] | None = None,
    mapped: list[str] | None = None,
) -> list[str]:
    """Where the interpreter finds packages, in the order it looks: the script's directory
    (or the working directory for `-m`), PYTHONPATH, site-packages loaded by the process
    (`mapped`: from /proc/PID/maps), the prefix's and the base prefix's site-packages, and
    the user's site-packages. Directories that do not exist are left out."""
    env = env or {}
    out: list[str] = []
    seen: set[str] = set()

    def add(path: str | None) -> None:
        # A hostile PYTHONPATH may name 100,000 directories: the first MAX_DIRS count.
        if path and len(out) < MAX_DIRS and path not in seen and os.path.isdir(path):
            seen.add(path)
            out.append(path)

    args = list(argv or [])
    if "-m" in args[1:3] and cwd:
        add(cwd)
    elif len(args) > 1 and not args[1].startswith("-"):
        script = args[1] if os.path.isabs(args[1]) else os.path.join(cwd or "", args[1])
        add(os.path.dirname(script))
    for part in env.get("PYTHONPATH", "").split(os.pathsep):
        add(os.path.join(cwd or "", part) if part and not os.path.isabs(part) else part)
    for path in mapped or []:
        add(path)
    bindir = os.path.dirname(executable)
    prefixes = [os.path.dirname(bindir)]
    cfg = _read(os.path.join(prefixes[0], "pyvenv.cfg"), 64 << 10) or ""
    home = _CFG_HOME.search(cfg)
    system = _CFG_SYSTEM_SITE.search(cfg)
    real_prefix = os.path.dirname(os.path.dirname(os.path.realpath(executable)))
    if not cfg or system:
        prefixes.append(os.path.dirname(home.group(1).strip()) if home else real_prefix)
        prefixes.append(real_prefix)
    for prefix in prefixes:
        for kind in ("site-packages", "dist-packages"):
            for found in sorted(glob.glob(os.path.join(prefix, "lib", "python3*", kind))):
                add(found)
            for found in sorted(glob.glob(os.path.join(prefix, "local", "lib", "python3*", kind))):
                add(found)
        if prefix.startswith("/usr"):
            add("/usr/lib/python3/dist-packages")
    home_dir = env.get("HOME")
    if home_dir and env.get("PYTHONNOUSERSITE") is None:
        for found in sorted(glob.glob(os.path.join(home_dir, ".local", "lib", "python3*",
                                                   "site-packages"))):  # fmt: skip
            add(found)
    return out


def _metadata(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            out[key.lower()] = value.strip()
    return out


def distributions(dirs: list[str], wanted: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """`wanted` distributions found in `dirs` (first wins, as the import system does):
    {name: {"version", "location", "editable"}}; `editable` is the source directory of an
    editable install (PEP 610 `direct_url.json`)."""
    want = {normalise(w) for w in wanted}
    found: dict[str, dict[str, Any]] = {}
    for d in dirs:
        try:
            entries = sorted(os.listdir(d))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith((".dist-info", ".egg-info")):
                continue
            stem = entry.rsplit(".", 1)[0]
            name = normalise(stem.split("-", 1)[0])
            if name not in want or name in found:
                continue
            meta_name = "METADATA" if entry.endswith(".dist-info") else "PKG-INFO"
            meta = _metadata(_read(os.path.join(d, entry, meta_name), 256 << 10) or "")
            if not meta.get("version"):
                continue
            record: dict[str, Any] = {"version": meta["version"], "location": d, "editable": None}
            direct = _read(os.path.join(d, entry, "direct_url.json"), 64 << 10)
            if direct:
                try:
                    doc = json.loads(direct)
                except ValueError:
                    doc = {}
                url = str(doc.get("url") or "") if isinstance(doc, dict) else ""
                info = doc.get("dir_info") if isinstance(doc, dict) else None
                if url.startswith("file://") and isinstance(info, dict) and info.get("editable"):
                    record["editable"] = url[len("file://") :]
            found[name] = record
    return found


def package_dir(dirs: list[str], package: str) -> str | None:
    """The directory a top-level package is imported from (the first in `dirs`)."""
    for d in dirs:
        candidate = os.path.join(d, package)
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def literal_assignments(source: str) -> dict[str, Any]:
    """Module-level `name = <literal>` of a Python file, parsed, never executed."""
    out: dict[str, Any] = {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # 20,000 `1+1+...`
        return out
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name):
            try:
                out[target.id] = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                continue
    return out


def torch_build(torch_dir: str | None) -> dict[str, Any] | None:
    """torch's version, CUDA and HIP from `torch/version.py`."""
    if torch_dir is None:
        return None
    values = literal_assignments(_read(os.path.join(torch_dir, "version.py"), 64 << 10) or "")
    if not values.get("__version__"):
        return None
    return {
        "version": str(values["__version__"]),
        "cuda": values.get("cuda") if isinstance(values.get("cuda"), str) else None,
        "hip": values.get("hip") if isinstance(values.get("hip"), str) else None,
        "git_version": values.get("git_version") if isinstance(values.get("git_version"), str)
        else None,
    }  # fmt: skip


def nccl_version(dirs: list[str], torch_dir: str | None) -> str | None:
    """NCCL as torch loads it: the `nvidia-nccl-*` wheel's version, else the version in the
    name of a `libnccl.so.X.Y.Z` shipped inside torch."""
    dists = distributions(dirs, NCCL_DISTS)
    for name in NCCL_DISTS:
        if name in dists:
            return str(dists[name]["version"])
    if torch_dir:
        for lib in sorted(glob.glob(os.path.join(torch_dir, "lib", "libnccl.so.*"))):
            found = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", lib)
            if found:
                return found.group(1)
    return None


def git_checkout(path: str | None, max_up: int = 6) -> dict[str, Any] | None:
    """The git commit of the checkout holding `path`: {"root", "commit", "branch"}.

    Reads `.git/HEAD`, the ref it names (loose or in `packed-refs`); a worktree's or
    submodule's `.git` file (`gitdir: ...`) is followed. Only the process's user's files
    are read there, and only a well-formed `refs/...` name (no `..`) is looked up: a
    planted `ref: ../../root/token` reads nothing."""
    if not path:
        return None
    current = os.path.abspath(path)
    for _ in range(max_up + 1):
        dot_git = os.path.join(current, ".git")
        if os.path.exists(dot_git):
            return _head_of(current, dot_git)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return None


def _head_of(root: str, dot_git: str) -> dict[str, Any] | None:
    git_dir = dot_git
    if os.path.isfile(dot_git):
        text = (_read_git(dot_git) or "").strip()
        if not text.startswith("gitdir:"):
            return None
        git_dir = os.path.normpath(os.path.join(root, text[len("gitdir:") :].strip()))
    head = (_read_git(os.path.join(git_dir, "HEAD")) or "").strip()
    common = git_dir
    common_file = (_read_git(os.path.join(git_dir, "commondir")) or "").strip()
    if common_file:
        common = os.path.normpath(os.path.join(git_dir, common_file))
    branch = None
    commit = None
    if head.startswith("ref:"):
        ref = head[len("ref:") :].strip()
        if not _REF.fullmatch(ref) or ".." in ref:
            return None
        branch = ref[len("refs/heads/") :] if ref.startswith("refs/heads/") else ref
        for base in (git_dir, common):
            text = (_read_git(os.path.join(base, *ref.split("/"))) or "").strip()
            if re.fullmatch(r"[0-9a-f]{40,64}", text):
                commit = text
                break
        if commit is None:
            packed = _read_git(os.path.join(common, "packed-refs"), MAX_FILE)
            for line in (packed or "").splitlines():
                sha, _, name = line.partition(" ")
                if name.strip() == ref and re.fullmatch(r"[0-9a-f]{40,64}", sha):
                    commit = sha
                    break
    elif re.fullmatch(r"[0-9a-f]{40,64}", head):
        commit = head
    if commit is None:
        return None
    return {"root": root, "commit": commit, "branch": branch}


def checkout_version(root: str) -> str | None:
    """`version = "..."` of a checkout's pyproject.toml (its [project] table)."""
    text = _read(os.path.join(root, "pyproject.toml"), 256 << 10) or ""
    in_project = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            in_project = stripped == "[project]"
        elif in_project:
            found = re.match(r'version\s*=\s*["\']([^"\']+)["\']', stripped)
            if found:
                return found.group(1)
    return None


def areal_info(dirs: list[str], dists: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """AReaL's version and, run from a source checkout, the checkout's commit."""
    where = package_dir(dirs, "areal")
    dist = dists.get("areal")
    if where is None and dist is None:
        return None
    source = dist.get("editable") if dist else None
    checkout = git_checkout(source or where) if (source or where) else None
    version = dist.get("version") if dist else None
    if version is None and checkout is not None:
        version = checkout_version(checkout["root"])
    return {
        "version": version,
        "path": where,
        "commit": checkout["commit"] if checkout else None,
        "branch": checkout["branch"] if checkout else None,
        "checkout": checkout["root"] if checkout else None,
    }


def driver_info(root: str = "/proc/driver/nvidia") -> dict[str, Any]:
    """The NVIDIA kernel driver's version and each GPU's model, from /proc."""
    text = _read(os.path.join(root, "version"), 64 << 10) or ""
    found = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+(?:\.\d+)+)", text)
    models = []
    for info in sorted(glob.glob(os.path.join(root, "gpus", "*", "information"))):
        model = re.search(r"^Model:\s*(.+)$", _read(info, 64 << 10) or "", re.M)
        if model:
            models.append(model.group(1).strip())
    return {"driver": found.group(1) if found else None, "gpus": models}


def os_info(os_release: str = "/etc/os-release") -> dict[str, Any]:
    text = _read(os_release, 64 << 10) or _read("/usr/lib/os-release", 64 << 10) or ""
    pretty = re.search(r'^PRETTY_NAME="?([^"\n]*)"?$', text, re.M)
    uname = os.uname()
    return {
        "os": pretty.group(1) if pretty else None,
        "kernel": uname.release,
        "machine": uname.machine,
    }


def interesting_env(env: dict[str, str]) -> dict[str, str]:
    """The variables a report shows; values of secret-looking names are `***`."""
    out: dict[str, str] = {}
    for name in sorted(env):
        if name.startswith(ENV_PREFIXES) and len(out) < MAX_ENV:
            out[name] = "***" if SECRET_NAME.search(name) else env[name][:512]
    return out


def interpreter_versions(
    executable: str,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    argv: list[str] | None = None,
    mapped: list[str] | None = None,
) -> dict[str, Any]:
    """Everything above for one interpreter (and how it was started)."""
    dirs = import_dirs(executable, env, cwd, argv, mapped)
    dists = distributions(dirs, WANTED)
    torch_dir = package_dir(dirs, "torch")
    torch = torch_build(torch_dir)
    if torch is None and "torch" in dists:
        torch = {"version": dists["torch"]["version"], "cuda": None, "hip": None,
                 "git_version": None}  # fmt: skip
    if torch is not None:
        torch["nccl"] = nccl_version(dirs, torch_dir)
    return {
        "executable": executable,
        "python": python_version_of(executable),
        "torch": torch,
        "packages": {name: d["version"] for name, d in sorted(dists.items())},
        "areal": areal_info(dirs, dists),
        "import_dirs": dirs,
    }


def _proc_environ(pid: int) -> dict[str, str]:
    raw = b""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError:
        pass
    out: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            out[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def mapped_site_dirs(pid: int) -> list[str]:
    """site-/dist-packages directories the process has loaded files from (its maps)."""
    text = _read(f"/proc/{pid}/maps", 8 << 20) or ""
    out: list[str] = []
    for line in text.splitlines():
        path = line.split(None, 5)[5] if len(line.split(None, 5)) == 6 else ""
        for marker in ("/site-packages/", "/dist-packages/"):
            at = path.find(marker)
            if at >= 0:
                site = path[: at + len(marker) - 1]
                if site not in out:
                    out.append(site)
    return out


def process_versions(pid: int) -> dict[str, Any]:
    """A running process's interpreter, packages and environment, from /proc and files."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode("utf-8", "replace") for a in fh.read(1 << 20).split(b"\0") if a]
        exe = os.readlink(f"/proc/{pid}/exe")
        uid, groups = _credentials(pid)
    except OSError as exc:
        return {"pid": pid, "error": f"cannot read process {pid}: {exc.strerror or exc}"}
    token = _PROCESS.set((uid, groups))
    try:
        return _process_versions(pid, argv, exe)
    finally:
        _PROCESS.reset(token)


def _credentials(pid: int) -> tuple[int, frozenset[int]]:
    """The process's effective uid and its groups (`Gid:` and `Groups:` of its status)."""
    uid, groups = os.stat(f"/proc/{pid}").st_uid, set()
    with open(f"/proc/{pid}/status", "rb") as fh:
        for line in fh.read(64 << 10).decode("ascii", "replace").splitlines():
            name, _, rest = line.partition(":")
            fields = rest.split()
            if name == "Uid" and len(fields) > 1 and fields[1].isdigit():
                uid = int(fields[1])
            elif name == "Gid" and len(fields) > 1 and fields[1].isdigit():
                groups.add(int(fields[1]))
            elif name == "Groups":
                groups.update(int(g) for g in fields if g.isdigit())
    return uid, frozenset(groups)


def _process_versions(pid: int, argv: list[str], exe: str) -> dict[str, Any]:
    env = _proc_environ(pid)
    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    # argv[0] keeps a venv's bin/python (the exe link resolves to the base interpreter).
    executable = exe
    first = argv[0] if argv else ""
    if first and "python" in os.path.basename(first):
        if os.path.isabs(first):
            executable = first
        else:
            for d in env.get("PATH", "").split(os.pathsep):
                candidate = os.path.join(d, first)
                if d and os.path.isfile(candidate):
                    executable = candidate
                    break
    out = interpreter_versions(executable, env, cwd, argv, mapped_site_dirs(pid))
    out["pid"] = pid
    out["environment"] = interesting_env(env)
    return out


def node_versions(pids: list[int], executable: str | None = None) -> dict[str, Any]:
    """The node's driver, GPUs and OS, and each process's interpreter (or `executable`'s
    when no process is named)."""
    interpreters = [process_versions(pid) for pid in pids[:64]]
    if executable and all("error" in i for i in interpreters):
        # No process left to read (a job that is gone): the interpreter that ran it.
        interpreters.append(interpreter_versions(executable, dict(os.environ)))
    return {"system": {**os_info(), **driver_info()}, "interpreters": interpreters}


def op_versions(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The `versions` op: args `pids` (list of int), `executable` (str, optional)."""
    pids = args.get("pids") or []
    if not isinstance(pids, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in pids
    ):
        raise ValueError("argument 'pids' must be a list of process ids")
    executable = args.get("executable")
    if executable is not None and not isinstance(executable, str):
        raise ValueError("argument 'executable' must be a string")
    return node_versions(pids, executable)


OPS = {"versions": op_versions}
