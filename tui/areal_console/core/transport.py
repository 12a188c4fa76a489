"""Byte channels to a node's agent: a local subprocess or (see `ssh.py`) an SSH exec channel.

Both run the same bootstrap: the node's `python3` looks for the agent in its cache by
content hash; on a miss it asks for the source on stdin, caches it atomically, and runs it.
A reconnect to a node that has the agent therefore costs a single round trip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from areal_agent import agent_hash, agent_source


def bootstrap_script(read_source: str, imports: str = "") -> str:
    """The agent bootstrap run with `python3 -c SCRIPT HASH` on a node.

    It runs the agent cached as ~/.cache/areal-console/agent-HASH.py when that file's
    sha256 is HASH; otherwise it prints `{"event":"need_source"}`, runs `read_source`
    (lines indented by one space that set `s` to the agent's source from stdin), caches
    the source and runs it. Kept free of quotes a remote shell would mangle.
    """
    return (
        f"import sys,os,hashlib{imports};h=sys.argv[1];"
        "d=os.path.join(os.path.expanduser('~'),'.cache','areal-console');"
        "p=os.path.join(d,'agent-'+h+'.py');"
        "s=open(p,'rb').read() if os.path.exists(p) else b''\n"
        "if hashlib.sha256(s).hexdigest()!=h:\n"
        ' sys.stdout.write(\'{"event":"need_source"}\\n\');sys.stdout.flush()\n'
        + read_source
        + " try:\n"
        "  os.makedirs(d,exist_ok=True);t=p+'.%d.tmp'%os.getpid();open(t,'wb').write(s);os.replace(t,p)\n"
        " except OSError:pass\n"
        "g={'__name__':'__areal_agent__'};exec(compile(s,p,'exec'),g)"
    )


# One SSH or local channel per agent: the source follows as a length line and the bytes.
BOOTSTRAP = bootstrap_script(" n=int(sys.stdin.buffer.readline());s=sys.stdin.buffer.read(n)\n")


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


class ProcessChannel:
    """A `Channel` over a local process's stdio (srun here, or ssh running srun)."""

    def __init__(
        self,
        argv: list[str],
        what: str,
        env: dict[str, str] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> None:
        self.what = what
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
            return self.proc.stdout.readline()
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
        errors = [ln for ln in self.stderr_lines() if "error" in ln.lower()] or self.stderr_lines()
        why = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"{self.what} {why}" + (f": {errors[0]}" if errors else "")


class LocalChannel(ProcessChannel):
    """The agent as a child process of the console, on this machine."""

    def __init__(self, python: str | None = None) -> None:
        super().__init__(bootstrap_argv(python or sys.executable), "agent")

    @property
    def pid(self) -> int:
        return self.proc.pid
