"""Masking what must not leave the machine, and (with --anonymize) who and where it ran.

A `Redactor` first `learn`s from every part of a report (secrets named as such: an
environment assignment, a command-line flag, a config key, a URL's password, a token of a
well-known shape), then `text`/`data` mask them in every part, including each learned
value wherever it appears again without its name (a log line echoing a key). A masked
value reads `***`, next to its name where it had one, else `***(NAME)`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MASK = "***"

# A name whose value is a credential: its last word(s) say so. `max_new_tokens`,
# `pad_token` and `tokenizer_path` are not.
_SECRET_WORDS = (
    r"(?:api|access|secret|private|auth|service|wandb|openai|hf|client)[_-]?key"
    r"|(?:auth[_-]?|access[_-]?|refresh[_-]?|bearer[_-]?|session[_-]?|api[_-]?|hf[_-]?|"
    r"hub[_-]?|github[_-]?|gh[_-]?|ray[_-]?|redis[_-]?|wandb[_-]?|slack[_-]?|id[_-]?)?token"
    r"|secret|passwd|password|passphrase|pwd|credentials?|cookie|authorization"
)
SECRET_NAME = re.compile(rf"(?:^|[^a-z0-9])(?:{_SECRET_WORDS})$", re.I)
NOT_SECRET = re.compile(r"(?:pad|eos|bos|unk|sep|cls|mask|stop|special)[_-]?token$", re.I)
_NAME = r"[A-Za-z_][\w.-]*"

# NAME=value (environment assignments, key=value overrides, `name = value` of INI/TOML),
# --flag value / --flag=value (dotted flags too), `key: value` (YAML, one line: a parent
# key's line never swallows the next) and "key": "value" (JSON; 'key': 'value' of a
# Python repr).
ASSIGN = re.compile(rf"(?<![\w.-])({_NAME})([ \t]*=[ \t]*)(\"[^\"]*\"|'[^']*'|[^\s\"',;&]+)")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(\s+|=)(\"[^\"]*\"|'[^']*'|[^\s\"']+)")
# Every pattern here reads another user's text (a 1 MiB log line), so each is written to
# run in linear time: no two adjacent parts that can take the same characters (the old
# YAML value `(\S.*?)[ \t]*$` rescanned the spaces after each character it took: `a: b`,
# 100,000 spaces and `c` took 41 s). A value ends at its last visible character (a CRLF
# line's `\r` is not part of it). tests/unit/test_regex_time.py runs every pattern on
# adversarial input.
YAML = re.compile(rf"^([ \t]*(?:-[ \t]*)?)({_NAME})([ \t]*:[ \t]+)(\S(?:.*\S)?)[^\S\n]*$", re.M)
JSON_PAIR = re.compile(
    r"\"([\w.-]+)\"(\s*:\s*)\"((?:[^\"\\]|\\.)*)\"|'([\w.-]+)'(\s*:\s*)'((?:[^'\\]|\\.)*)'"
)
# A scheme starts where no scheme character precedes it (`\b` let each `a` of `a.a.a...`
# start a scan to the end of the run).
URL_USERINFO = re.compile(
    r"(?<![a-z0-9+.-])([a-z][a-z0-9+.-]*://)([^\s/:@]*)(?::([^\s/@]+))?@", re.I
)
BEARER = re.compile(r"\b(Bearer|Basic|token)(\s+)([A-Za-z0-9._~+/=-]{12,})", re.I)
# Credentials recognisable by their shape alone.
TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_\w{20,}|xox[abprs]-[\w-]{10,}|AKIA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]{10,})\b"
)
IPV4 = re.compile(
    r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\w.])"
)
KEEP_IPS = frozenset({"0.0.0.0"})
USER_KEYS = frozenset({"user", "owner", "username"})
# Variables whose value names hosts beyond the nodes reached (a Slurm host list, the
# rendezvous host): `--anonymize` learns those names too.
HOST_VARS = ("MASTER_ADDR", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURMD_NODENAME",
             "SLURM_STEP_NODELIST", "HOSTNAME")  # fmt: skip
_HOST_ASSIGN = re.compile(rf"(?<![\w.-])({'|'.join(HOST_VARS)})=([^\s\"',;]+)")


def is_secret_name(name: str) -> bool:
    bare = name.lstrip("-")
    if len(bare) > 64:  # the secret words end the name: its tail decides (a name can be 1 MiB)
        bare = "x" + bare[-64:]  # `x`: the cut is no start of a word
    return bool(SECRET_NAME.search(bare)) and not NOT_SECRET.search(bare)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


@dataclass
class Redactor:
    """Masks secrets; with `anonymize`, also host names, IPs and user names, each
    replaced by the same alias everywhere (`host-1`, `ip-1`, `user-1`)."""

    anonymize: bool = False
    secrets: dict[str, str] = field(default_factory=dict)  # value -> the name it had
    hosts: dict[str, str] = field(default_factory=dict)
    users: dict[str, str] = field(default_factory=dict)
    ips: dict[str, str] = field(default_factory=dict)

    # learning -----------------------------------------------------------------------
    def _remember(self, name: str, value: str) -> None:
        value = _unquote(value)
        # An escaped value (JSON, a Python repr, YAML double quotes) also as it reads
        # unescaped: a config's "a\"b" is the a"b a log line echoes.
        for form in dict.fromkeys((value, _unescaped(value))):
            if len(form) >= 4 and form != MASK and not form.startswith(MASK):
                self.secrets.setdefault(form, name.lstrip("-"))

    def learn(self, text: str) -> None:
        """Find the secrets `text` names (call on every part before masking any)."""
        for m in ASSIGN.finditer(text):
            if is_secret_name(m.group(1)):
                self._remember(m.group(1), m.group(3))
        for m in FLAG.finditer(text):
            if is_secret_name(m.group(1)):
                self._remember(m.group(1), m.group(3))
        for m in YAML.finditer(text):
            if is_secret_name(m.group(2)):
                self._remember(m.group(2), m.group(4))
        for m in JSON_PAIR.finditer(text):
            key, value = _json_pair(m)
            if is_secret_name(key):
                self._remember(key, value)
        for m in URL_USERINFO.finditer(text):
            if m.group(3):
                self._remember("URL password", m.group(3))
        for m in BEARER.finditer(text):
            self._remember(m.group(1), m.group(3))
        for m in TOKEN_SHAPES.finditer(text):
            self._remember("token", m.group(0))

    def learn_data(self, data: Any) -> None:
        for text in _strings(data):
            self.learn(text)
        for key, value in _pairs(data):
            if is_secret_name(key) and isinstance(value, str):
                self._remember(key, value)
        for name, value in _variables(data):  # py-spy --locals: {"name", "repr"}
            self._remember(name, value)

    def learn_hosts(self, names: Iterable[str | None]) -> None:
        for name in names:
            if name and name not in self.hosts and not IPV4.fullmatch(name) and name != "localhost":
                self.hosts[name] = f"host-{len(self.hosts) + 1}"

    def learn_users(self, names: Iterable[str | None]) -> None:
        for name in names:
            if name and name not in self.users:
                self.users[name] = f"user-{len(self.users) + 1}"

    # masking ------------------------------------------------------------------------
    def text(self, text: str) -> str:
        """`text` with every known and named secret masked (and anonymized)."""
        text = ASSIGN.sub(
            lambda m: f"{m.group(1)}{m.group(2)}{MASK}" if is_secret_name(m.group(1))
            else m.group(0),
            text,
        )  # fmt: skip
        text = FLAG.sub(
            lambda m: f"{m.group(1)}{m.group(2)}{MASK}" if is_secret_name(m.group(1))
            else m.group(0),
            text,
        )  # fmt: skip
        text = YAML.sub(_mask_yaml, text)
        text = JSON_PAIR.sub(_mask_json_pair, text)
        text = URL_USERINFO.sub(_mask_userinfo, text)
        text = BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
        text = TOKEN_SHAPES.sub(f"{MASK}(token)", text)
        for value in sorted(self.secrets, key=len, reverse=True):
            if value in text:
                text = text.replace(value, f"{MASK}({self.secrets[value]})")
        if self.anonymize:
            text = self._anonymized(text)
        return text

    def _anonymized(self, text: str) -> str:
        def ip(m: re.Match[str]) -> str:
            found = m.group(0)
            if found in KEEP_IPS:
                return found
            return self.ips.setdefault(found, f"ip-{len(self.ips) + 1}")

        text = IPV4.sub(ip, text)
        # Host names: one pass over the text whatever the number of hosts (a Slurm host
        # list gives thousands; a pass per host was minutes per MiB). A name stands where
        # a run of name characters starts, and ends at the run's end or before a dot
        # (`gpu-07.cluster`); the longest known name wins. Names with other characters
        # (a host list's own text, `gpu-[07-08]`) are few, and replaced one by one.
        plain = {n: a for n, a in self.hosts.items() if _HOST_RUN.fullmatch(n)}
        for name in sorted(set(self.hosts) - set(plain), key=len, reverse=True):
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", self.hosts[name], text)
        if plain:
            text = _HOST_RUN.sub(lambda m: _alias_run(m.group(0), plain), text)
        for name in sorted(self.users, key=len, reverse=True):
            alias = self.users[name]
            u = re.escape(name)
            # Only where a user name stands: a path segment, user@host, user=NAME.
            text = re.sub(rf"(?<=/){u}(?=/|\b)", alias, text)
            text = re.sub(rf"(?<![\w.-]){u}(?=@)", alias, text)
            text = re.sub(rf"(?i)(\buser(?:name)?\s*[=:]\s*['\"]?){u}\b", rf"\g<1>{alias}", text)
        return text

    def data(self, data: Any) -> Any:
        """A JSON-like value with every string masked, and every value of a secret key."""
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            out = {}
            variable = _variable_name(data)
            for k, v in data.items():
                if variable is not None and k == "repr":
                    out[k] = MASK
                    continue
                key = self.text(k) if isinstance(k, str) else k
                if isinstance(k, str) and is_secret_name(k) and isinstance(v, (str, int, float)):
                    out[key] = MASK
                elif self.anonymize and k in USER_KEYS and isinstance(v, str) and v in self.users:
                    out[key] = self.users[v]  # a process record's "user": "alice"
                else:
                    out[key] = self.data(v)
            return out
        if isinstance(data, (list, tuple)):
            return [self.data(v) for v in data]
        return data


_HOST_RUN = re.compile(r"(?<![\w.-])[\w.-]+")


def _alias_run(run: str, hosts: dict[str, str]) -> str:
    """`run` (a maximal run of name characters) with its leading host name aliased: the
    whole run, else the longest part before a dot that is a known host."""
    cut = len(run)
    while cut > 0:
        alias = hosts.get(run[:cut])
        if alias is not None and (cut == len(run) or run[cut] == "."):
            return alias + run[cut:]
        cut = run.rfind(".", 0, cut)
    return run


def _mask_yaml(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(2)):
        return m.group(0)
    scheme = re.match(r"(?i)(Bearer|Basic|token)\s+", m.group(4))  # a header's scheme stays
    value = f"{scheme.group(0)}{MASK}" if scheme else f"'{MASK}'"
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{value}"


def _json_pair(m: re.Match[str]) -> tuple[str, str]:
    """(key, value) of a JSON_PAIR match, double- or single-quoted."""
    return (m.group(1), m.group(3)) if m.group(1) is not None else (m.group(4), m.group(6))


def _mask_json_pair(m: re.Match[str]) -> str:
    key = _json_pair(m)[0]
    if not is_secret_name(key):
        return m.group(0)
    q = '"' if m.group(1) is not None else "'"
    return f"{q}{key}{q}{m.group(2) or m.group(5)}{q}{MASK}{q}"


def _unescaped(value: str) -> str:
    """`value` with backslash escapes undone (as JSON reads them), else as it is."""
    if "\\" not in value:
        return value
    import json

    try:
        decoded = json.loads(f'"{value}"')
    except ValueError:
        return value
    return decoded if isinstance(decoded, str) else value


def _mask_userinfo(m: re.Match[str]) -> str:
    scheme, user, password = m.group(1), m.group(2), m.group(3)
    if password is not None:
        return f"{scheme}{user}:{MASK}@"
    if len(user) >= 16:  # a token as the user part (https://TOKEN@host)
        return f"{scheme}{MASK}@"
    return m.group(0)


def _strings(data: Any) -> Iterable[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str):
                yield k
            yield from _strings(v)
    elif isinstance(data, (list, tuple)):
        for v in data:
            yield from _strings(v)


def _variable_name(data: dict[Any, Any]) -> str | None:
    """A local variable ({"name", "repr"}, as py-spy --locals gives it) named as a secret."""
    name = data.get("name")
    if isinstance(name, str) and isinstance(data.get("repr"), str) and is_secret_name(name):
        return name
    return None


def _variables(data: Any) -> Iterable[tuple[str, str]]:
    if isinstance(data, dict):
        name = _variable_name(data)
        if name is not None:
            yield name, str(data["repr"])
        for v in data.values():
            yield from _variables(v)
    elif isinstance(data, (list, tuple)):
        for v in data:
            yield from _variables(v)


def _pairs(data: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str):
                yield k, v
            yield from _pairs(v)
    elif isinstance(data, (list, tuple)):
        for v in data:
            yield from _pairs(v)


def learn_identities(redactor: Redactor, inputs: Any) -> None:
    """Host and user names for `--anonymize` to replace (a `ReportInputs`): the nodes,
    this machine, and the user in the log directory's path (`.../logs/<user>/...`)."""
    import getpass
    import socket

    hosts = {str(p.get("node")) for p in inputs.processes if p.get("node")}
    hosts |= {v.node for v in inputs.versions} | {socket.gethostname()}
    hosts |= {n for t in inputs.logs for n in t.nodes} | set(inputs.log_nodes)
    hosts |= set(_named_hosts(inputs))
    hosts.discard("local")
    redactor.learn_hosts(sorted(hosts))
    users = {getpass.getuser()} | {str(p["user"]) for p in inputs.processes if p.get("user")}
    parts = (inputs.log_dir or "").split("/")
    if "logs" in parts and len(parts) > parts.index("logs") + 1:
        users.add(parts[parts.index("logs") + 1])
    redactor.learn_users(sorted(users))


def _named_hosts(inputs: Any) -> Iterable[str]:
    """Hosts the job's environment and command lines name (HOST_VARS): each host of a
    Slurm host list, and the list's own text (`gpu-[07-08]`)."""
    from areal_console.core.common.errors import UserError
    from areal_console.core.targets.hostlist import expand_hostlist

    values = [m.group(2) for p in inputs.processes
              for m in _HOST_ASSIGN.finditer(str(p.get("cmdline") or ""))]  # fmt: skip
    for version in inputs.versions:
        for interp in version.interpreters:
            env = interp.get("environment") if isinstance(interp, dict) else None
            values += [str(env[k]) for k in HOST_VARS if isinstance(env, dict) and env.get(k)]
    for value in values:
        if IPV4.fullmatch(value):
            continue
        yield value
        if "[" in value:
            try:
                yield from expand_hostlist(value)[:4096]
            except UserError:
                continue
