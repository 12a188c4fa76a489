"""The user's ssh_config, read once per version of the file and looked up per node without
visiting every `Host` block (a 512-host config made both the cost that grew with nodes)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

SSH_CONFIG_ENV = "AREAL_CONSOLE_SSH_CONFIG"


class SshError(ConnectionError):
    """Reaching a node over SSH failed; the message is one line for the user."""


def ssh_config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(SSH_CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    default = Path("~/.ssh/config").expanduser()
    return default if default.exists() else None


def load_ssh_config(path: Path | None) -> paramiko.SSHConfig:
    """The parsed ssh config at `path`: parsed once per version of the file (its mtime and
    size), not once per node (a 512-host config costs ~15 ms to parse)."""
    if path is None:
        return paramiko.SSHConfig()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise SshError(f"ssh config {path} does not exist") from None
    except OSError as exc:
        raise SshError(f"cannot read ssh config {path}: {exc.strerror or exc}") from None
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    # One parse: the fan-out's threads all start here at once, and wait for the first.
    with _PARSING:
        config = _CONFIGS.get(key)
        if config is not None:
            return config
        try:
            config = paramiko.SSHConfig.from_path(str(path))
        except FileNotFoundError:
            raise SshError(f"ssh config {path} does not exist") from None
        except (OSError, paramiko.ConfigParseError) as exc:
            raise SshError(f"cannot read ssh config {path}: {exc}") from None
        with _PARSED_LOCK:
            _CONFIGS.clear()  # only the newest version of each file is looked up again
            _CONFIGS[key] = config
    return config


_PARSING = threading.Lock()  # held while a file is read and parsed (one at a time)
_PARSED_LOCK = threading.Lock()
_CONFIGS: dict[tuple[str, int, int], paramiko.SSHConfig] = {}
_WILDCARDS = frozenset("*?[!")


@dataclass(frozen=True)
class _HostIndex:
    """A parsed config's `Host` blocks by name: the blocks that can apply to an alias are
    the ones naming it literally plus the ones with patterns, in file order."""

    contexts: list[dict[str, Any]]
    literal: dict[str, tuple[int, ...]]
    patterned: tuple[int, ...]


_INDEXES: dict[int, tuple[paramiko.SSHConfig, _HostIndex | None]] = {}


def _host_index(config: paramiko.SSHConfig) -> _HostIndex | None:
    """The index of `config`, or None where a lookup may depend on more than the alias
    (`Match` blocks, `CanonicalizeHostname`): paramiko's own lookup then."""
    with _PARSED_LOCK:
        found = _INDEXES.get(id(config))
    if found is not None and found[0] is config:
        return found[1]
    contexts: list[dict[str, Any]] = list(getattr(config, "_config", None) or [])
    index: _HostIndex | None = None
    simple = contexts and all(
        "matches" not in c and "canonicalizehostname" not in c.get("config", {}) for c in contexts
    )
    if simple:
        literal: dict[str, list[int]] = {}
        patterned: list[int] = []
        for i, context in enumerate(contexts):
            patterns = context.get("host") or []
            if any(_WILDCARDS & set(p) for p in patterns):
                patterned.append(i)
            else:
                for pattern in patterns:
                    literal.setdefault(pattern, []).append(i)
        index = _HostIndex(contexts, {k: tuple(v) for k, v in literal.items()}, tuple(patterned))
    with _PARSED_LOCK:
        _INDEXES.clear()  # one config in use at a time; an older one is not looked up again
        _INDEXES[id(config)] = (config, index)
    return index


def lookup_host(config: paramiko.SSHConfig, alias: str) -> paramiko.SSHConfigDict:
    """`config.lookup(alias)`, without visiting every `Host` block: paramiko's lookup runs
    `getpass.getuser()` for each block (19 ms per alias in a 512-host config). The blocks
    that cannot apply to `alias` are left out and paramiko looks up the rest, so the
    answer is paramiko's own."""
    index = _host_index(config)
    if index is None:
        return config.lookup(alias)
    chosen = set(index.literal.get(alias, ()))
    chosen.update(
        i
        for i in index.patterned
        if config._pattern_matches(index.contexts[i]["host"], alias)  # type: ignore[attr-defined]
    )
    reduced = paramiko.SSHConfig()
    reduced._config = [index.contexts[i] for i in sorted(chosen)]  # type: ignore[attr-defined]
    return reduced.lookup(alias)
