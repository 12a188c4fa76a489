"""Byte channels to a node's agent: a local subprocess or (see `ssh.py`) an SSH exec channel.

Both run the same bootstrap: the node's `python3` looks for the node payload (the
`areal_node` package as one zip, see `payload.py`) in its cache by content hash; on a miss
it asks for it on stdin, caches it atomically, puts it on `sys.path` and starts the agent
from it. A reconnect to a node that has the payload therefore costs a single round trip.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from areal_node import launcher
from areal_node.agent.protocol import MAX_REPLY_BYTES

from areal_console.core.connection.payload import node_payload, payload_name

# The oldest Python the agent runs on (it is checked first, before anything else runs).
MIN_PYTHON = (3, 9)
# Exit statuses of the bootstrap, with one `areal-agent: ...` line on stderr saying why.
EXIT_OLD_PYTHON = 86
EXIT_UNSAFE_CACHE = 87

# The bootstrap the node's python runs (`python3 -c BOOTSTRAP HASH`). It looks for the
# payload in the node's cache by content hash; on a miss it asks for it and caches it.
# Written for Python 2.7 and 3.x syntax, so that an old interpreter can still say why it
# cannot run the agent. The cache is trusted only when it is a real directory (not a link)
# owned by the user and writable by no one else; the file is read without following links
# or blocking (a FIFO there must not hang), and written to a new temp file
# (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) renamed into place. Where it cannot be cached, an
# unnamed temp file holds it for this run. The checked zip then goes first on `sys.path`
# and the agent is imported from it. zipimport compiles every module twice (up to Python
# 3.13 its `get_filename` compiles the source to learn the module's path, and the import
# machinery asks for that path before it asks for the code): `Z` names the path from the
# documented `archive`, `prefix` and `is_package` instead, so each module compiles once.
_BOOTSTRAP_HEAD = (
    "import sys,os,hashlib,stat\n"
    "def die(c,m):\n"
    " sys.stderr.write('areal-agent: '+m+'\\n');sys.stderr.flush();os._exit(c)\n"
    "if sys.version_info<@MIN@:\n"
    " import socket\n"
    " die(@OLD@,'python-too-old %d.%d.%d @NEED@ %s %s'%(sys.version_info[:3]+"
    "(socket.gethostname(),sys.executable)))\n"
    "h=sys.argv[1]\n"
    "d=os.path.join(os.environ.get('XDG_CACHE_HOME') or "
    "os.path.join(os.path.expanduser('~'),'.cache'),'areal-console')\n"
    "p=os.path.join(d,'@NAME@'%h)\n"
    "try:\n"
    " os.makedirs(d,0o700)\n"
    "except OSError:\n"
    " pass\n"
    "try:\n"
    " st=os.lstat(d)\n"
    "except OSError as e:\n"
    " die(@CACHE@,'cannot use the agent cache %s: %s'%(d,e.strerror))\n"
    "if not stat.S_ISDIR(st.st_mode):\n"
    " die(@CACHE@,'the agent cache %s is not a directory (a link or a file): remove it'%d)\n"
    "if st.st_uid!=os.getuid():\n"
    " die(@CACHE@,'the agent cache %s belongs to uid %d, not to you (uid %d): refusing to use it'"
    "%(d,st.st_uid,os.getuid()))\n"
    "if st.st_mode&0o022:\n"
    " die(@CACHE@,'the agent cache %s is writable by others (mode %o): refusing to use it; "
    "chmod 700 it'%(d,stat.S_IMODE(st.st_mode)))\n"
    "def rd():\n"
    " s=b''\n"
    " try:\n"
    "  f=os.open(p,os.O_RDONLY|os.O_NOFOLLOW|os.O_NONBLOCK)\n"
    " except OSError as e:\n"
    "  f=None\n"
    "  if os.path.lexists(p) and not os.path.isfile(p) or os.path.islink(p):\n"
    "   die(@CACHE@,'the agent cache file %s is not a regular file: remove it'%p)\n"
    " if f is not None:\n"
    "  if not stat.S_ISREG(os.fstat(f).st_mode):\n"
    "   os.close(f);die(@CACHE@,'the agent cache file %s is not a regular file (a FIFO or a "
    "device?): remove it'%p)\n"
    "  while True:\n"
    "   b=os.read(f,1<<20)\n"
    "   if not b:break\n"
    "   s+=b\n"
    "  os.close(f)\n"
    " return s\n"
    "s=rd();r=0\n"
    "if hashlib.sha256(s).hexdigest()!=h:\n"
    ' sys.stdout.write(\'{"event":"need_source"}\\n\');sys.stdout.flush()\n'
)
# The payload as a length-prefixed frame on stdin: `N` and N bytes, or `zN` and N bytes
# of zlib; or `0`: look in the cache again (another node sharing this home has just
# written it), asking again when it is still not there.
_SOURCE_FROM_FRAME = (
    " while True:\n"
    "  l=sys.stdin.buffer.readline()\n"
    "  if not l:os._exit(1)\n"
    "  if l[:1]==b'z':\n"
    "   import zlib;s=zlib.decompress(sys.stdin.buffer.read(int(l[1:])));break\n"
    "  if l.strip()==b'0':\n"
    "   s=rd()\n"
    "   if hashlib.sha256(s).hexdigest()==h:r=1;break\n"
    '   sys.stdout.write(\'{"event":"need_source"}\\n\');sys.stdout.flush();continue\n'
    "  s=sys.stdin.buffer.read(int(l));break\n"
)
# The payload (base64) in the one JSON line addressed to no node (the shared Slurm step:
# agents that already run drop it like any request for another node).
_SOURCE_FROM_JSON = (
    " import json\n"
    " while True:\n"
    "  l=sys.stdin.buffer.readline()\n"
    "  if not l:sys.exit(1)\n"
    "  try:m=json.loads(l)\n"
    "  except ValueError:continue\n"
    "  if isinstance(m,dict) and 'payload' in m:\n"
    "   import base64;s=base64.b64decode(m['payload']);break\n"
)
_BOOTSTRAP_TAIL = (
    " if hashlib.sha256(s).hexdigest()!=h:die(@CACHE@,'the agent payload arrived damaged')\n"
    " t=p+'.%d.tmp'%os.getpid()\n"
    " try:\n"
    "  if not r:\n"  # r: found in the cache on a second look (another node wrote it)
    "   f=os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o600)\n"
    "   with os.fdopen(f,'wb') as o:o.write(s)\n"
    "   os.replace(t,p)\n"
    " except OSError as e:\n"
    "  try:os.unlink(t)\n"
    "  except OSError:pass\n"
    "  sys.stderr.write('areal-agent: note: not cached (%s: %s)\\n'%(p,e.strerror))\n"
    "  import tempfile\n"
    "  k=tempfile.TemporaryFile();k.write(s);k.flush();p='/dev/fd/%d'%k.fileno()\n"
    "import zipimport\n"
    "class Z(zipimport.zipimporter):\n"
    " def get_filename(self,n):\n"
    "  t=n.rpartition('.')[2];f=os.path.join(t,'__init__.py') if self.is_package(n) else t+'.py'\n"
    "  return os.path.join(self.archive,self.prefix,f)\n"
    "sys.path_hooks.insert(0,Z);sys.path.insert(0,p)\n"
    "from areal_node.agent.serve import main\n"
    "main()"
)


def _fill(script: str) -> str:
    return (
        script.replace("@MIN@", repr(MIN_PYTHON))
        .replace("@NEED@", ".".join(map(str, MIN_PYTHON)))
        .replace("@OLD@", str(EXIT_OLD_PYTHON))
        .replace("@CACHE@", str(EXIT_UNSAFE_CACHE))
        .replace("@NAME@", payload_name("%s"))
        .replace("@ISOLATED@", " ".join(launcher.ISOLATED))
    )


BOOTSTRAP = _fill(_BOOTSTRAP_HEAD + _SOURCE_FROM_FRAME + _BOOTSTRAP_TAIL)
SHARED_BOOTSTRAP = _fill(_BOOTSTRAP_HEAD + _SOURCE_FROM_JSON + _BOOTSTRAP_TAIL)


# Where the node's own environment decides the interpreter (Slurm: `srun` passes on the
# caller's PATH, or none at all under `--export=NONE`): a POSIX sh runs on the node, tries
# the configured python, then `python3` on the node's PATH, then the usual places, and
# starts the first one new enough. None found: one `areal-agent: no-python` line naming
# every candidate and why it was passed over. argv: sh -c SCRIPT NAME PYTHON CODE HASH.
# It first leaves the folder it was started in (srun's fallback is /tmp, where anyone
# plants files) for the user's home, or /.
RESOLVE_PYTHON = (
    "want=$1; code=$2; hash=$3; PATH=${PATH:-/usr/local/bin:/usr/bin:/bin}; export PATH\n"
    'cd -- "${HOME:-/}" 2>/dev/null || cd /\n'
    'seen="|"; tried=""\n'
    'for py in "$want" python3 /usr/bin/python3 /usr/local/bin/python3; do\n'
    '  exe=$(command -v "$py" 2>/dev/null) || { tried="$tried, $py: not found"; continue; }\n'
    '  case "$seen" in *"|$exe|"*) continue;; esac\n'
    '  seen="$seen$exe|"\n'
    '  ver=$("$exe" -E -s -c \'import sys;sys.stdout.write("%d.%d.%d"%sys.version_info[:3]);'
    'sys.exit(sys.version_info<@MIN@)\' 2>/dev/null) && exec "$exe" @ISOLATED@ -c "$code" "$hash"\n'
    '  tried="$tried, $exe is ${ver:-not runnable}"\n'
    "done\n"
    'echo "areal-agent: no-python $(hostname) @NEED@ ${tried#, }" >&2\n'
    "exit @OLD@\n"
)


def resolving_argv(python: str, code: str) -> list[str]:
    """`/bin/sh` choosing the interpreter on the node, then running `code` with it."""
    return [
        "/bin/sh", "-c", _fill(RESOLVE_PYTHON), "areal-agent", python, code, node_payload().sha256
    ]  # fmt: skip


_BOOTSTRAP_LINE = re.compile(r"areal-agent: (?!note:)(.+)")
_NO_ISOLATED = re.compile(r"^\s*Unknown option:? -I\b")  # an interpreter without -I


def bootstrap_problem(
    lines: list[str], python: str | None = None, node: str | None = None
) -> str | None:
    """Why the bootstrap refused to run the agent (its `areal-agent:` stderr line), said
    for the user; None when it did not."""
    if any(_NO_ISOLATED.search(line) for line in lines):  # Python 2, or 3.0-3.3
        where = f" on {node}" if node else ""
        return (
            f"{python or 'python'}{where} does not know `-I` (older than Python 3.4); the "
            f"agent needs >= {'.'.join(map(str, MIN_PYTHON))}: install a newer Python there, "
            "or name one in the inventory (`python: /path/to/python3`)"
        )
    for line in reversed(lines):
        found = _BOOTSTRAP_LINE.search(line)
        if not found:
            continue
        text = found.group(1).strip()
        if text.startswith("python-too-old "):
            _, version, need, host, exe = [*text.split(" ", 4), "", "", "", ""][:5]
            return (
                f"{python or exe} on {node or host} is {version} ({exe}); the agent needs "
                f">= {need}: install a newer Python there, or name one in the inventory "
                "(`python: /path/to/python3`)"
            )
        if text.startswith("no-python "):
            _, host, need, tried = [*text.split(" ", 3), "", "", ""][:4]
            return (
                f"no Python >= {need} on {node or host} (tried {tried}): install one there, "
                "or name it in the inventory (`python: /path/to/python3`)"
            )
        return f"{node}: {text}" if node else text
    return None


def bootstrap_argv(python: str = "python3") -> list[str]:
    """The agent bootstrap, isolated (`launcher.isolated`: no working directory on
    sys.path, no PYTHON* variables, no user site)."""
    return launcher.isolated(python, BOOTSTRAP, node_payload().sha256)


class Channel(Protocol):
    """A bidirectional line channel to one agent process."""

    def send(self, data: bytes) -> None: ...

    def recv_line(self) -> bytes:
        """One line including the newline; b"" at EOF."""
        ...

    def close(self) -> None: ...

    def exit_reason(self) -> str:
        """Why the channel ended (exit status, stderr tail, signal), for the user."""
        ...


class ChannelClosed(Exception):
    pass


# The longest line a channel hands on: above the agent's own bound on a reply. A longer
# one (a hostile or broken agent) is skipped to its end and handed on as TOO_LONG plus its
# first bytes, so that the client can fail the request it answers.
MAX_LINE_BYTES = MAX_REPLY_BYTES + (16 << 20)
TOO_LONG = b"\0too-long\0"
TOO_LONG_HEAD = 256


def bounded_readline(readline: Callable[[int], bytes], limit: int = MAX_LINE_BYTES) -> bytes:
    """One line from `readline(size)`, or TOO_LONG + its head for a line over `limit`
    (the rest read and dropped, never held); b"" at EOF."""
    line = readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line
    head = line[:TOO_LONG_HEAD]
    del line
    while True:
        rest = readline(1 << 20)
        if not rest or rest.endswith(b"\n"):
            return TOO_LONG + head.replace(b"\n", b" ") + b"\n"


def source_frame() -> bytes:
    """The payload as the bootstrap reads it on a cache miss, compressed: `z`, the length,
    a newline, the zlib bytes (made once per process)."""
    global _frame
    with _frame_lock:
        if _frame is None:
            import zlib

            packed = zlib.compress(node_payload().data, 6)
            _frame = b"z" + str(len(packed)).encode() + b"\n" + packed
        return _frame


# Sent instead of the payload to a node that may share its home with one that has just
# written the payload to its cache: look again (it asks again if still missing).
RECHECK_FRAME = b"0\n"
_frame: bytes | None = None
_frame_lock = threading.Lock()


class ProcessChannel:
    """A `Channel` over a local process's stdio (srun here, or ssh running srun)."""

    def __init__(
        self,
        argv: list[str],
        what: str,
        env: dict[str, str] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        *,
        python: str | None = None,
        node: str | None = None,
    ) -> None:
        self.what = what
        self.python, self.node = python, node  # for the bootstrap's own errors
        self.on_stderr = on_stderr
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the console must not end the step
                env=env,
            )
        except FileNotFoundError as exc:
            raise OSError(f"{what}: {argv[0]} not found") from exc
        self._stderr: list[bytes] = []
        self._send_lock = threading.Lock()
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-20]
            if self.on_stderr is not None:
                self.on_stderr(line.decode(errors="replace"))

    def wait_stderr(self, timeout: float = 5.0) -> None:
        """Wait until the process's stderr is fully read (its last words explain its end)."""
        self._stderr_reader.join(timeout)

    def stderr_lines(self) -> list[str]:
        return [b.decode(errors="replace").strip() for b in self._stderr if b.strip()]

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._send_lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise ChannelClosed(self.exit_reason()) from exc

    def recv_line(self) -> bytes:
        assert self.proc.stdout is not None
        try:
            return bounded_readline(self.proc.stdout.readline)
        except (ValueError, OSError):
            return b""

    def close(self) -> None:
        """EOF ends the agents and so the step; srun gets SIGTERM (it ends the step) if not."""
        if self.proc.poll() is not None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                self.proc.wait(timeout=3)
                return
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    return
        self.proc.wait()

    def exit_reason(self) -> str:
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                return f"{self.what}: agent stopped answering"
        # Its last words explain its end: on a busy machine the exit can be seen before
        # the stderr reader has read them.
        self.wait_stderr(2.0)
        problem = bootstrap_problem(self.stderr_lines(), self.python, self.node)
        if problem:
            return problem
        errors = [ln for ln in self.stderr_lines() if "error" in ln.lower()] or self.stderr_lines()
        why = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"{self.what} {why}" + (f": {errors[0]}" if errors else "")


class LocalChannel(ProcessChannel):
    """The agent as a child process of the console, on this machine.

    It keeps the console's working directory (relative paths the user typed, e.g.
    `replay ./dump`, mean what they meant); it is isolated (`-I`), so nothing there is
    imported, and the jobs it starts run in their own private folders."""

    def __init__(self, python: str | None = None) -> None:
        python = python or sys.executable
        super().__init__(bootstrap_argv(python), "agent", python=python, node="this machine")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        """EOF ends the agent; it is reaped in the background (nobody waits on its exit)."""
        if self.proc.poll() is not None:
            return
        threading.Thread(target=super().close, name="agent-reaper", daemon=True).start()


class InProcessChannel:
    """The agent served by a thread of this process, over a pair of pipes.

    For one-shot commands on this machine: no interpreter to start, nothing to compile,
    the same protocol and code path as a child agent.
    """

    def __init__(self) -> None:
        from areal_node.agent.serve import Agent

        to_agent_r, to_agent_w = os.pipe()
        from_agent_r, from_agent_w = os.pipe()
        self._to_agent = os.fdopen(to_agent_w, "wb")
        self._from_agent = os.fdopen(from_agent_r, "rb")
        agent_in = os.fdopen(to_agent_r, "rb")
        agent_out = os.fdopen(from_agent_w, "wb")
        self._send_lock = threading.Lock()
        self._closed = False

        def serve() -> None:
            try:
                Agent(stdin=agent_in, stdout=agent_out).serve()
            finally:
                agent_in.close()
                agent_out.close()  # EOF for the reader

        self._thread = threading.Thread(target=serve, name="in-process-agent", daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self._to_agent.write(data)
                self._to_agent.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise ChannelClosed(self.exit_reason()) from exc

    def recv_line(self) -> bytes:
        try:
            return bounded_readline(self._from_agent.readline)
        except (ValueError, OSError):
            return b""

    def close(self) -> None:
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                self._to_agent.close()  # EOF: the agent's loop ends

    def exit_reason(self) -> str:
        return "in-process agent stopped" if self._closed else "in-process agent ended"
