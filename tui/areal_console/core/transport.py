"""Byte channels to a node's agent: a local subprocess or (see `ssh.py`) an SSH exec channel.

Both run the same bootstrap: the node's `python3` looks for the agent in its cache by
content hash; on a miss it asks for the source on stdin, caches it atomically, and runs it.
A reconnect to a node that has the agent therefore costs a single round trip.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Protocol

from areal_agent import agent_hash, agent_source

# Kept on one line so it survives any remote shell's quoting as a single argument.
BOOTSTRAP = (
    "import sys,os,hashlib;h=sys.argv[1];"
    "d=os.path.join(os.path.expanduser('~'),'.cache','areal-console');"
    "p=os.path.join(d,'agent-'+h+'.py');"
    "s=open(p,'rb').read() if os.path.exists(p) else b'';"
    "ok=hashlib.sha256(s).hexdigest()==h\n"
    "if not ok:\n"
    ' sys.stdout.write(\'{"event":"need_source"}\\n\');sys.stdout.flush()\n'
    " n=int(sys.stdin.buffer.readline());s=sys.stdin.buffer.read(n)\n"
    " try:\n"
    "  os.makedirs(d,exist_ok=True);t=p+'.%d.tmp'%os.getpid();open(t,'wb').write(s);os.replace(t,p)\n"
    " except OSError:pass\n"
    "g={'__name__':'__areal_agent__'};exec(compile(s,p,'exec'),g)"
)


def bootstrap_argv(python: str = "python3") -> list[str]:
    return [python, "-c", BOOTSTRAP, agent_hash()]


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


def source_frame() -> bytes:
    src = agent_source()
    return str(len(src)).encode() + b"\n" + src


class LocalChannel:
    """The agent as a child process of the console, on this machine."""

    def __init__(self, python: str | None = None) -> None:
        self.proc = subprocess.Popen(
            bootstrap_argv(python or sys.executable),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C in the console must not kill the agent mid-reply
        )
        self._stderr: list[bytes] = []
        self._send_lock = threading.Lock()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-20]

    @property
    def pid(self) -> int:
        return self.proc.pid

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
            return self.proc.stdout.readline()
        except (ValueError, OSError):
            return b""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def exit_reason(self) -> str:
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                return "agent stopped answering"
        tail = b"".join(self._stderr).decode(errors="replace").strip().splitlines()
        why = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"agent {why}" + (f": {tail[-1]}" if tail else "")
