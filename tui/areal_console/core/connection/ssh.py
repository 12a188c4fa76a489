"""The SSH transport: the node agent over a paramiko exec channel.

`open_ssh_channel(spec)` resolves the node through the user's ssh config (HostName, User,
Port, IdentityFile, ProxyJump with chained jump hosts, UserKnownHostsFile), connects with a
timeout, verifies the host key, authenticates with ssh-agent keys and key files, and runs
the agent bootstrap with the node's `python3`.

Host keys are checked against `~/.ssh/known_hosts`, any `UserKnownHostsFile` of the ssh
config, and the console's own file (`locations.known_hosts_file()`). An unknown key is
refused with `UnknownHostKey` (which carries the fingerprint and can `trust()` it) unless
`accept_new_hosts` is set; a changed key is always refused with `ChangedHostKey`.
Every failure is an `SshError` whose message is one line a user can act on.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from areal_console.core.common import locations, private_files
from areal_console.core.common.errors import UserError
from areal_console.core.connection.pacing import PACER
from areal_console.core.connection.ssh_config import (
    SshError,
    load_ssh_config,
    lookup_host,
    ssh_config_path,
)
from areal_console.core.connection.transport import (
    ChannelClosed,
    bootstrap_argv,
    bootstrap_problem,
    bounded_readline,
)
from areal_console.core.targets.inventory import parse_destination
from areal_console.core.targets.options import DEFAULT_MAX_STARTUPS
from areal_console.core.targets.specs import NodeSpec, is_host

# paramiko logs transport errors itself; with no handler Python would print them on
# stderr, over the TUI. Every failure reaches the user through SshError instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_CONNECT_TIMEOUT = 10.0
KEEPALIVE_SECONDS = 15
IDLE_WAKEUP_SECONDS = 2.0  # a connected transport thread's wakeup (paramiko's: 0.1 s)
MAX_JUMPS = 8


class HostKeyError(SshError):
    """The node's host key could not be verified."""

    def __init__(self, message: str, host: str, key: paramiko.PKey) -> None:
        super().__init__(message)
        self.host = host  # as written in known_hosts: `name` or `[name]:port`
        self.key = key

    @property
    def key_type(self) -> str:
        return self.key.get_name()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)


class UnknownHostKey(HostKeyError):
    """The host offered a key not found in any known-hosts file.

    A UI shows `host`, `key_type` and `fingerprint`, asks the user, then calls `trust()`.
    """

    def __init__(self, host: str, key: paramiko.PKey, known_hosts: Path | None = None) -> None:
        super().__init__(
            f"host key for {host} is unknown ({key.get_name()} {fingerprint(key)}); "
            "verify it and use --accept-new-hosts to trust it",
            host,
            key,
        )
        self.known_hosts = known_hosts or locations.known_hosts_file()

    def trust(self) -> None:
        """Remember this key in the console's known-hosts file."""
        remember_host_key(self.host, self.key, self.known_hosts)


class ChangedHostKey(HostKeyError):
    """The host offered a key different from the one on record: refused, always."""

    def __init__(self, host: str, key: paramiko.PKey, expected: paramiko.PKey) -> None:
        super().__init__(
            f"WARNING: host key for {host} has CHANGED: it now offers {key.get_name()} "
            f"{fingerprint(key)}, known_hosts has {expected.get_name()} {fingerprint(expected)}; "
            "this could be an attack. Refusing to connect; if the change is expected, "
            "remove the old entry from your known_hosts",
            host,
            key,
        )
        self.expected = expected


class RevokedHostKey(HostKeyError):
    """The host offered a key marked `@revoked` in a known-hosts file: refused, always."""

    def __init__(self, host: str, key: paramiko.PKey, where: str) -> None:
        super().__init__(
            f"host key for {host} ({key.get_name()} {fingerprint(key)}) is REVOKED in "
            f"{where}: refusing to connect",
            host,
            key,
        )


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint (`SHA256:...`, base64 without padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def remember_host_key(host: str, key: paramiko.PKey, path: Path | None = None) -> None:
    """Append `host key` to a known-hosts file (the console's by default)."""
    path = path or locations.known_hosts_file()
    line = f"{host} {key.get_name()} {key.get_base64()}\n"
    with _KNOWN_HOSTS_LOCK, private_files.append(path) as f:
        f.write(line)


_KNOWN_HOSTS_LOCK = threading.Lock()


# --------------------------------------------------------------------------------------
# reading known-hosts files (paramiko's own reader fails the whole file on a marker line)


@dataclass(frozen=True)
class KnownHostsFile:
    """One known-hosts file: the usable entries, the `@revoked` ones, and what was skipped."""

    entries: tuple[tuple[tuple[str, ...], paramiko.PKey], ...]
    revoked: tuple[tuple[tuple[str, ...], paramiko.PKey, str], ...]  # patterns, key, file:line
    notes: tuple[str, ...]


_NOTES: dict[str, None] = {}  # not yet taken (a CLI run prints them at its end)
_NOTES_TAKEN: set[str] = set()  # said already: every reconnect reads the files again
_NOTES_LOCK = threading.Lock()


def _note(text: str) -> None:
    with _NOTES_LOCK:
        if text not in _NOTES_TAKEN:
            _NOTES.setdefault(text, None)


def take_notes() -> list[str]:
    """Warnings about known-hosts files gathered since the last call, each once per process."""
    with _NOTES_LOCK:
        notes = list(_NOTES)
        _NOTES.clear()
        _NOTES_TAKEN.update(notes)
    return notes


def read_known_hosts(path: Path) -> KnownHostsFile:
    """Parse an OpenSSH known-hosts file line by line: `@revoked` lines are kept to refuse
    their keys, `@cert-authority` lines are skipped (host certificates are not checked),
    and a line that cannot be read is skipped; none of them fails the rest of the file."""
    entries: list[tuple[tuple[str, ...], paramiko.PKey]] = []
    revoked: list[tuple[tuple[str, ...], paramiko.PKey, str]] = []
    notes: list[str] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SshError(f"cannot read known hosts file {path}: {exc.strerror or exc}") from None
    authorities = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker == "@cert-authority":
                authorities += 1
                continue
            if marker != "@revoked":
                notes.append(f"{path}:{number}: unknown marker {marker!r}: line skipped")
                continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except (paramiko.SSHException, ValueError, TypeError) as exc:
            notes.append(f"{path}:{number}: unreadable entry skipped ({exc.__class__.__name__})")
            continue
        if entry is None or entry.key is None:
            notes.append(f"{path}:{number}: unreadable or unsupported entry skipped")
            continue
        names = tuple(entry.hostnames)
        if marker == "@revoked":
            revoked.append((names, entry.key, f"{path}:{number}"))
        else:
            entries.append((names, entry.key))
    if authorities:
        notes.append(
            f"{path}: {authorities} @cert-authority line(s) skipped: host certificates are "
            "not checked, so hosts known only through a CA are treated as unknown"
        )
    return KnownHostsFile(tuple(entries), tuple(revoked), tuple(notes))


def _host_matches(name: str, patterns: tuple[str, ...]) -> bool:
    """OpenSSH host patterns: `*`/`?` wildcards, `!` negation, hashed `|1|` names."""
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        if body.startswith("|1|"):
            hit = paramiko.HostKeys.hash_host(name, body) == body
        else:  # only * and ? are special (a `[host]:port` name has literal brackets)
            wild = re.escape(body).replace(r"\*", ".*").replace(r"\?", ".")
            hit = re.fullmatch(wild, name, flags=re.IGNORECASE) is not None
        if hit and negated:
            return False
        matched = matched or hit
    return matched


@dataclass(frozen=True)
class KnownHosts:
    """The keys of a set of known-hosts files, read once and shared by every connection
    that checks against the same files (paramiko only looks them up)."""

    keys: paramiko.HostKeys
    revoked: tuple[tuple[tuple[str, ...], paramiko.PKey, str], ...]


_READING = threading.Lock()  # held while known_hosts files are read (one at a time)
_READ_LOCK = threading.Lock()
_KNOWN: dict[tuple[tuple[str, int, int], ...], KnownHosts] = {}


def known_hosts_for(paths: list[Path]) -> KnownHosts:
    """The keys of the existing files among `paths`, read when one of them changed (mtime,
    size) since the last call, else the same shared record."""
    versions: list[tuple[str, int, int]] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue  # not there (yet): nothing known from it
        versions.append((str(path), stat.st_mtime_ns, stat.st_size))
    key = tuple(versions)
    with _READING:  # one read: the other connections wait for it
        return _known_hosts_read(key)


def _known_hosts_read(key: tuple[tuple[str, int, int], ...]) -> KnownHosts:
    with _READ_LOCK:
        known = _KNOWN.get(key)
    if known is not None:
        return known
    versions = list(key)
    keys = paramiko.HostKeys()
    revoked: list[tuple[tuple[str, ...], paramiko.PKey, str]] = []
    for name, _mtime, _size in versions:
        parsed = read_known_hosts(Path(name))
        for names, host_key in parsed.entries:
            for host in names:
                keys.add(host, host_key.get_name(), host_key)
        revoked.extend(parsed.revoked)
        for note in parsed.notes:
            _note(note)
    known = KnownHosts(keys, tuple(revoked))
    with _READ_LOCK:
        stale = [k for k in _KNOWN if {p for p, _, _ in k} == {p for p, _, _ in key}]
        for old_key in stale:  # an older version of the same files
            del _KNOWN[old_key]
        _KNOWN[key] = known
    return known


class _VerifyingClient(paramiko.SSHClient):
    """An SSHClient that refuses `@revoked` host keys, known or not, before authenticating."""

    def __init__(self, host_name: str, known: KnownHosts | None = None) -> None:
        super().__init__()
        self.host_name = host_name  # as known_hosts writes it: name or [name]:port
        self.revoked: list[tuple[tuple[str, ...], paramiko.PKey, str]] = []
        if known is not None:
            # The shared keys, looked up only (our policy never adds to them): every
            # connection copying 512 entries in costs more than its key exchange.
            self._host_keys = known.keys
            self.revoked = list(known.revoked)

    def refuse_revoked(self, key: paramiko.PKey) -> None:
        for patterns, bad, where in self.revoked:
            if bad == key and _host_matches(self.host_name, patterns):
                raise RevokedHostKey(self.host_name, key, where)

    def _auth(self, *args: Any, **kwargs: Any) -> Any:
        transport = self.get_transport()
        if transport is not None:
            self.refuse_revoked(transport.get_remote_server_key())
        return super()._auth(*args, **kwargs)  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# resolving a node through the ssh config


@dataclass(frozen=True)
class Hop:
    """One SSH connection to make: the target, or a jump host on the way."""

    alias: str
    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: tuple[str, ...] = ()
    connect_timeout: float | None = None
    accept_new_key: bool = False  # `StrictHostKeyChecking accept-new` (or `no`) in the config
    proxy_command: str | None = None  # used when this hop is the first of the route

    @property
    def label(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.hostname}:{self.port}"


@dataclass
class ResolvedRoute:
    """The jump hosts (in order) and then the target."""

    jumps: list[Hop] = field(default_factory=list)
    target: Hop | None = None


def _hop(
    config: paramiko.SSHConfig,
    alias: str,
    user: str | None = None,
    port: int | None = None,
    identity_file: str | None = None,
) -> tuple[Hop, str | None]:
    """One host resolved through the config: (hop, its ProxyJump or None)."""
    entry = lookup_host(config, alias)
    files = [str(Path(p).expanduser()) for p in entry.get("identityfile", [])]
    if identity_file:  # an inventory's key replaces the config's, it does not add to them
        files = [str(Path(identity_file).expanduser())]
    known_text = entry.get("userknownhostsfile")
    known = tuple(
        str(Path(p).expanduser())
        for p in (known_text.split() if isinstance(known_text, str) else [])
        if p != "/dev/null"
    )
    timeout = entry.get("connecttimeout")
    proxy_command = entry.get("proxycommand")  # paramiko has expanded %h, %p, %r
    hop = Hop(
        alias=alias,
        hostname=entry.get("hostname", alias),
        port=port or int(entry.get("port", 22)),
        user=user or entry.get("user"),
        identity_files=tuple(dict.fromkeys(files)),
        identities_only=str(entry.get("identitiesonly", "no")).lower() == "yes",
        known_hosts_files=known,
        connect_timeout=float(timeout) if timeout else None,
        # "no" is taken as "accept-new": a changed key is refused whatever the config says.
        accept_new_key=str(entry.get("stricthostkeychecking", "")).lower() in ("accept-new", "no"),
        proxy_command=proxy_command if proxy_command and proxy_command != "none" else None,
    )
    jump = entry.get("proxyjump")
    return hop, (None if not jump or jump.lower() == "none" else jump)


def resolve_route(spec: NodeSpec, config: paramiko.SSHConfig) -> ResolvedRoute:
    """The jump chain and target for `spec`; explicit spec fields win over the config."""
    if not spec.host:
        raise SshError(f"node {spec.name} has no host")
    if not is_host(spec.host):  # never a `%h` that adds options to a ProxyCommand
        raise SshError(f"not a host name or address: {spec.host[:200]!r}")
    target, config_jump = _hop(config, spec.host, spec.user, spec.port, spec.identity_file)
    jump_text = spec.proxy_jump if spec.proxy_jump is not None else config_jump
    if jump_text is not None and jump_text.lower() == "none":
        jump_text = None
    jumps: list[Hop] = []
    pending = jump_text
    while pending:
        # A jump host may itself sit behind another: its own ProxyJump comes first.
        chain: list[Hop] = []
        next_pending: str | None = None
        for i, part in enumerate(p for p in pending.split(",") if p.strip()):
            try:
                user, host, port = parse_destination(part.strip().removeprefix("ssh://"))
            except UserError as exc:
                raise SshError(f"bad ProxyJump {pending!r}: {exc}") from None
            hop, own_jump = _hop(config, host, user, port)
            if i == 0:
                next_pending = own_jump
            chain.append(hop)
        jumps[:0] = chain
        if len(jumps) > MAX_JUMPS:
            raise SshError(f"ProxyJump chain for {spec.host} is longer than {MAX_JUMPS} (a loop?)")
        pending = next_pending
    return ResolvedRoute(jumps=jumps, target=target)


# --------------------------------------------------------------------------------------
# host key verification


class _VerifyingPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko when no known-hosts file has the host: refuse or remember."""

    def __init__(self, accept_new: bool, console_file: Path, port: int) -> None:
        self.accept_new = accept_new
        self.console_file = console_file
        self.port = port

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        # paramiko passes `[host]:port` already for non-default ports.
        if isinstance(client, _VerifyingClient):
            client.refuse_revoked(key)  # a revoked key is never learnt
        if self.accept_new:
            remember_host_key(hostname, key, self.console_file)
            return
        raise UnknownHostKey(hostname, key, self.console_file)


def _known_host_files(hop: Hop) -> list[Path]:
    files = [Path("~/.ssh/known_hosts").expanduser()]
    files += [Path(p) for p in hop.known_hosts_files]
    return list(dict.fromkeys(files))


# --------------------------------------------------------------------------------------
# connecting


def _open_socket(hop: Hop, timeout: float) -> socket.socket:
    try:
        return socket.create_connection((hop.hostname, hop.port), timeout=timeout)
    except socket.gaierror as exc:
        raise SshError(f"cannot resolve host name {hop.hostname!r}: {exc.strerror}") from None
    except ConnectionRefusedError:
        raise SshError(
            f"connection refused by {hop.hostname}:{hop.port} (is sshd running there?)"
        ) from None
    except TimeoutError:
        raise SshError(
            f"connection to {hop.hostname}:{hop.port} timed out after {timeout:g}s"
        ) from None
    except OSError as exc:
        raise SshError(f"cannot reach {hop.hostname}:{hop.port}: {exc.strerror or exc}") from None


def _connect_hop(
    hop: Hop,
    sock: Any,
    *,
    timeout: float,
    accept_new_hosts: bool,
    allow_agent: bool,
    look_for_keys: bool,
    console_known_hosts: Path,
) -> paramiko.SSHClient:
    known = known_hosts_for([*_known_host_files(hop), console_known_hosts])
    client = _VerifyingClient(known_hosts_name(hop.hostname, hop.port), known)
    client.set_missing_host_key_policy(
        _VerifyingPolicy(accept_new_hosts or hop.accept_new_key, console_known_hosts, hop.port)
    )
    user = hop.user or _local_user()
    keys = [p for p in hop.identity_files if os.path.exists(p)]
    if hop.identity_files and not keys and hop.identities_only:
        raise SshError(f"identity file {hop.identity_files[0]} does not exist")
    try:
        client.connect(
            hop.hostname,
            port=hop.port,
            username=user,
            key_filename=keys or None,  # type: ignore[arg-type]  # a list is accepted
            sock=sock,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            allow_agent=allow_agent and not hop.identities_only,
            look_for_keys=look_for_keys and not (hop.identities_only and keys),
        )
    except HostKeyError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        name = known_hosts_name(hop.hostname, hop.port)
        raise ChangedHostKey(name, exc.key, exc.expected_key) from None
    except paramiko.AuthenticationException:
        client.close()
        tried = ", ".join(keys) if keys else "ssh-agent and default keys"
        raise SshError(
            f"authentication failed for {user}@{hop.hostname}:{hop.port} (tried {tried})"
        ) from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise SshError(
            f"key for {user}@{hop.hostname} is encrypted: add it to ssh-agent (ssh-add)"
        ) from None
    except (paramiko.SSHException, EOFError) as exc:
        # The transport thread's own error (e.g. no banner) says more than the symptom.
        saved = getattr(client.get_transport(), "saved_exception", None)
        client.close()
        detail = str(saved or exc) or exc.__class__.__name__
        if "no authentication methods" in detail.lower():
            raise SshError(
                f"authentication failed for {user}@{hop.hostname}:{hop.port}: no key to offer "
                "(no IdentityFile, no default key, ssh-agent empty or not running)"
            ) from None
        lowered = detail.lower()
        if "banner" in lowered or "timed out" in lowered:
            detail = f"no SSH answer within {timeout:g}s ({detail})"
        elif "no existing session" in lowered:
            # paramiko gives up negotiating at the timeout without saying so
            detail = f"no SSH answer within {timeout:g}s (handshake did not finish)"
        raise SshError(f"ssh to {hop.label} failed: {detail}") from None
    except TimeoutError:
        client.close()
        raise SshError(f"ssh to {hop.label} timed out after {timeout:g}s") from None
    except OSError as exc:
        client.close()
        raise SshError(f"ssh to {hop.label} failed: {exc.strerror or exc}") from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_SECONDS)
        # paramiko's transport thread wakes every 0.1 s to see whether it was closed: ten
        # wakeups a second per node for nothing once connected. Closing still ends it (its
        # packetizer is closed at once); keepalives need no finer step than this.
        with contextlib.suppress(OSError, AttributeError):
            transport.sock.settimeout(IDLE_WAKEUP_SECONDS)
    return client


def _local_user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError):
        return "root"


def _hop_through(
    via: paramiko.SSHClient | None, hop: Hop, timeout: float, **auth: Any
) -> paramiko.SSHClient:
    """Connect to `hop`, directly or tunnelled through the `via` connection."""
    if via is None and hop.proxy_command:
        try:
            sock: Any = paramiko.ProxyCommand(hop.proxy_command)
        except (OSError, paramiko.SSHException) as exc:
            raise SshError(f"ProxyCommand for {hop.alias} did not start: {exc}") from None
    elif via is None:
        sock = _open_socket(hop, timeout)
    else:
        transport = via.get_transport()
        if transport is None or not transport.is_active():
            raise SshError(f"the jump host's connection dropped before reaching {hop.hostname}")
        try:
            sock = transport.open_channel(
                "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            raise SshError(
                f"jump host cannot reach {hop.hostname}:{hop.port}: {exc.text}"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SshError(
                f"jump host could not open a tunnel to {hop.hostname}:{hop.port}: {exc}"
            ) from None
    return _connect_hop(hop, sock, timeout=timeout, **auth)


def _active(clients: list[paramiko.SSHClient]) -> bool:
    transports = [c.get_transport() for c in clients]
    return all(t is not None and t.is_active() for t in transports)


def _close_all(clients: list[paramiko.SSHClient]) -> None:
    for client in reversed(clients):
        # Wake the transport thread now (it polls its socket for up to IDLE_WAKEUP_SECONDS):
        # it must not still be polling the descriptor once another socket reuses it.
        sock = getattr(client.get_transport(), "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            client.close()


@dataclass
class _JumpEntry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    clients: list[paramiko.SSHClient] | None = None
    users: int = 0
    error: BaseException | None = None
    failed_at: float = 0.0


class JumpPool:
    """Jump-host connections shared by every node behind them (as ssh's ControlMaster).

    Sixty-four nodes behind one login node make one SSH connection to it, not sixty-four
    (which its sshd's `MaxStartups` would start dropping), and one key exchange.
    """

    FAILURE_MEMORY = 2.0  # seconds a failed jump is reported to waiters without retrying

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[Any, ...], _JumpEntry] = {}

    def acquire(
        self, key: tuple[Any, ...], connect: Callable[[], list[paramiko.SSHClient]]
    ) -> list[paramiko.SSHClient]:
        """The live connection chain for `key`, connecting it once if needed."""
        with self._lock:
            entry = self._entries.setdefault(key, _JumpEntry())
            entry.users += 1
        try:
            with entry.lock:  # one handshake; the other nodes wait for it
                if entry.clients is not None and _active(entry.clients):
                    return entry.clients
                if entry.error and time.monotonic() - entry.failed_at < self.FAILURE_MEMORY:
                    raise entry.error
                stale, entry.clients = entry.clients, None
                if stale:
                    _close_all(stale)
                try:
                    entry.clients = connect()
                except BaseException as exc:
                    entry.error, entry.failed_at = exc, time.monotonic()
                    raise
                entry.error = None
                return entry.clients
        except BaseException:
            self.release(key)
            raise

    def release(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.users -= 1
            if entry.users > 0:
                return
            del self._entries[key]
            clients, entry.clients = entry.clients, None
        if clients:
            _close_all(clients)

    def connections(self) -> int:
        """How many jump chains are open (for tests and status lines)."""
        with self._lock:
            return sum(1 for e in self._entries.values() if e.clients)


JUMPS = JumpPool()


def gateway(route: ResolvedRoute) -> str:
    """Where a route's new connections arrive first, the sshd whose MaxStartups they count
    against: its first jump host, else its ProxyCommand (the target's name and port taken
    out: `ssh -W %h:%p login` for every node is one gateway), else the target itself."""
    first = route.jumps[0] if route.jumps else route.target
    assert first is not None
    if first.proxy_command:
        words = [
            "%h" if w == first.hostname else "%p" if w == str(first.port) else w
            for w in re.split(r"([\s:@,'\"=])", first.proxy_command)
        ]
        return "ProxyCommand " + "".join(words)
    return first.label


@dataclass
class RouteConnection:
    """An authenticated connection to a node, and the shared jump chain it rides on."""

    target: paramiko.SSHClient
    jumps: list[paramiko.SSHClient]
    _release: Callable[[], None] | None = None

    def close(self) -> None:
        _close_all([self.target])
        release, self._release = self._release, None
        if release is not None:
            release()


def connect_route(
    route: ResolvedRoute,
    *,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    accept_new_hosts: bool = False,
    allow_agent: bool = True,
    look_for_keys: bool = True,
    known_hosts_file: Path | None = None,
    share_jumps: bool = True,
    max_startups: int = DEFAULT_MAX_STARTUPS,
) -> RouteConnection:
    """Connect through the jump hosts (shared with other nodes) to the target, at most
    `max_startups` handshakes in flight through the same gateway (`pacing.py`)."""
    assert route.target is not None
    gate = gateway(route)
    auth: dict[str, Any] = {
        "accept_new_hosts": accept_new_hosts,
        "allow_agent": allow_agent,
        "look_for_keys": look_for_keys,
        "console_known_hosts": known_hosts_file or locations.known_hosts_file(),
    }

    def connect_jumps() -> list[paramiko.SSHClient]:
        clients: list[paramiko.SSHClient] = []
        try:
            for hop in route.jumps:
                via = clients[-1] if clients else None
                with PACER.slot(gate, max_startups):
                    clients.append(_hop_through(via, hop, hop.connect_timeout or timeout, **auth))
        except BaseException:
            _close_all(clients)
            raise
        return clients

    jumps: list[paramiko.SSHClient] = []
    release: Callable[[], None] | None = None
    if route.jumps:
        if share_jumps:
            key = (tuple(route.jumps), str(auth["console_known_hosts"]))
            jumps = JUMPS.acquire(key, connect_jumps)
            release = lambda: JUMPS.release(key)  # noqa: E731
        else:
            jumps = connect_jumps()
            release = lambda: _close_all(jumps)  # noqa: E731
    hop = route.target
    try:
        via = jumps[-1] if jumps else None
        with PACER.slot(gate, max_startups):
            target = _hop_through(via, hop, hop.connect_timeout or timeout, **auth)
    except BaseException:
        if release is not None:
            release()
        raise
    return RouteConnection(target, jumps, release)


# --------------------------------------------------------------------------------------
# the channel


class SshChannel:
    """The agent's stdio over one SSH exec channel (a `transport.Channel`)."""

    def __init__(self, route: RouteConnection, command: str, node: str, python: str) -> None:
        self.route = route
        self.node = node
        self.python = python
        transport = route.target.get_transport()
        assert transport is not None
        self.transport = transport
        try:
            self.chan = transport.open_session()
            self.chan.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            route.close()
            raise SshError(f"{node}: cannot start the agent: {exc}") from None
        self._stdout = self.chan.makefile("rb")
        self._stderr: list[bytes] = []
        self._send_lock = threading.Lock()
        self._closed = False
        self._stderr_reader = threading.Thread(
            target=self._drain_stderr, name=f"ssh-stderr-{node}", daemon=True
        )
        self._stderr_reader.start()

    def _drain_stderr(self) -> None:
        try:
            for line in self.chan.makefile_stderr("rb"):
                self._stderr.append(line)
                del self._stderr[:-20]
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self.chan.sendall(data)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise ChannelClosed(self.exit_reason()) from exc

    def recv_line(self) -> bytes:
        try:
            return bounded_readline(lambda size: bytes(self._stdout.readline(size)))
        except (OSError, EOFError, paramiko.SSHException, ValueError):
            return b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.close()
        self.route.close()

    def exit_reason(self) -> str:
        """Why the agent's channel ended, in one line."""
        if self._closed:
            return "connection closed by the console"
        status: int | None = None
        if self.chan.status_event.wait(1.0):
            status = self.chan.exit_status
            # The remote command ended: let the reader take its last stderr lines first,
            # they usually say why (e.g. "python3: command not found").
            self._stderr_reader.join(1.0)
        tail_lines = b"".join(self._stderr).decode(errors="replace").strip().splitlines()
        problem = bootstrap_problem(tail_lines, self.python, self.node)
        if problem:
            return problem
        tail = tail_lines[-1] if tail_lines else ""
        if status == 127 or "command not found" in tail or "No such file" in tail:
            return (
                f"{self.python} not found on {self.node}: install Python 3 there "
                f"or set the node's python in the inventory ({tail or 'exit 127'})"
            )
        if status is not None and status >= 0:
            return f"agent on {self.node} exited with status {status}" + (
                f": {tail}" if tail else ""
            )
        if not self.transport.is_active():
            return f"SSH connection to {self.node} lost"
        if self.chan.exit_status == -1 and self.chan.closed:
            return f"agent on {self.node} was killed" + (f": {tail}" if tail else "")
        return f"agent on {self.node} stopped" + (f": {tail}" if tail else "")


def open_ssh_channel(
    spec: NodeSpec,
    *,
    accept_new_hosts: bool = False,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ssh_config: str | os.PathLike[str] | None = None,
    allow_agent: bool = True,
    look_for_keys: bool = True,
    known_hosts_file: str | os.PathLike[str] | None = None,
    share_jumps: bool = True,
    max_startups: int = DEFAULT_MAX_STARTUPS,
) -> SshChannel:
    """Connect to `spec`'s node and start its agent; raises `SshError` with a clear reason."""
    config = load_ssh_config(ssh_config_path(ssh_config))
    route = resolve_route(spec, config)
    connection = connect_route(
        route,
        timeout=connect_timeout,
        accept_new_hosts=accept_new_hosts,
        allow_agent=allow_agent,
        look_for_keys=look_for_keys,
        known_hosts_file=Path(known_hosts_file) if known_hosts_file else None,
        share_jumps=share_jumps,
        max_startups=max_startups,
    )
    command = shlex.join(bootstrap_argv(spec.python))
    return SshChannel(connection, command, spec.name, spec.python)


def describe_route(spec: NodeSpec, ssh_config: str | None = None) -> str:
    """`user@host:port via jump1 -> jump2`, for display."""
    route = resolve_route(spec, load_ssh_config(ssh_config_path(ssh_config)))
    assert route.target is not None
    via = " -> ".join(h.label for h in route.jumps)
    return route.target.label + (f" via {via}" if via else "")


__all__ = [
    "ChangedHostKey",
    "HostKeyError",
    "RevokedHostKey",
    "SshChannel",
    "SshError",
    "UnknownHostKey",
    "describe_route",
    "fingerprint",
    "open_ssh_channel",
    "remember_host_key",
    "resolve_route",
]
