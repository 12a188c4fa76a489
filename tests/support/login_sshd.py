"""A real SSH login host on this machine (sshd on 127.0.0.1 with generated keys).

Sessions on it see the test Slurm cluster (`SLURM_CONF` is set by sshd) and this checkout's
PATH, like a login node where Slurm's commands are. The OpenSSH client reaches it with
`client_options()` (identity, port, a private known_hosts), as `~/.ssh/config` would.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def _sshd() -> str:
    return shutil.which("sshd") or "/usr/sbin/sshd"


def skip_reason() -> str | None:
    """Why a login host cannot run here (OpenSSH missing), or None."""
    if not Path(_sshd()).exists() or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "openssh-server and openssh-client are needed for the login host"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoginHost:
    def __init__(self, base: Path, slurm_conf: Path) -> None:
        self.base = base
        self.base.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.slurm_conf = slurm_conf
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def login(self) -> str:
        return "root@127.0.0.1"

    def client_options(self) -> list[str]:
        return [
            "-p",
            str(self.port),
            "-i",
            str(self.base / "client_key"),
            "-o",
            f"UserKnownHostsFile={self.base / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
        ]

    def start(self, timeout: float = 20.0) -> LoginHost:
        """Start sshd; RuntimeError (with sshd's log) when it does not come up."""
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        sshd = _sshd()
        b = self.base
        for key in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(b / key)], check=True
            )
        (b / "authorized_keys").write_text((b / "client_key.pub").read_text())
        host_pub = (b / "host_key.pub").read_text().split()
        (b / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        (b / "sshd_config").write_text(
            f"""ListenAddress 127.0.0.1
Port {self.port}
HostKey {b / "host_key"}
AuthorizedKeysFile {b / "authorized_keys"}
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PidFile {b / "sshd.pid"}
MaxStartups 200
MaxSessions 200
SetEnv SLURM_CONF={self.slurm_conf} PATH={os.environ.get("PATH", "/usr/bin:/bin")}
"""
        )
        self.proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(b / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=open(b / "sshd.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(b / 'sshd.log').read_text()[-500:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def _session_pids(self) -> list[int]:
        """sshd's per-connection children (each in its own session, so not in our group)."""
        assert self.proc is not None
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    out.append(int(entry.name))
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for pid in self._session_pids():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
