"""SSH targets from the command line (`--hosts`) or a cluster inventory file (`--inventory`).

An inventory is YAML:

    defaults:                 # applied to every node unless the node says otherwise
      user: alice
      jump: login.example.org # or proxy_jump; chains as "a,b"
      python: python3
    nodes:
      - gpu-[001-004]         # shorthand: [user@]host[:port], with optional [a-b] ranges
      - name: gpu-005
        host: 10.0.0.5
        port: 2222
        identity_file: ~/.ssh/cluster_ed25519
        groups: [rollout]
    groups:                   # named groups, selectable with --group
      train: [gpu-001, gpu-002]

`nodes` may also be a mapping of name -> fields. Mistakes raise `UserError` naming the file
and line.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from areal_console.core.common import safe_yaml
from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import clip, clip_repr
from areal_console.core.targets.hostlist import expand_hostlist, split_hostlist
from areal_console.core.targets.specs import NodeSpec

NODE_FIELDS = {
    "name",
    "host",
    "port",
    "user",
    "identity_file",
    "jump",
    "proxy_jump",
    "python",
    "groups",
}
DEFAULT_FIELDS = NODE_FIELDS - {"name", "host", "groups"}
TOP_LEVEL = {"defaults", "nodes", "groups"}


# --------------------------------------------------------------------------------------
# --hosts


def expand_destinations(text: str) -> list[str]:
    """`[user@]HOSTLIST[:port]` -> one `[user@]host[:port]` per host of the Slurm hostlist
    (`alice@n[01-03,7]:2222`); an IPv6 literal (`[fe80::1]:22`) is taken as it is."""
    user, at, host = text.rpartition("@")
    if host.startswith("[") and ":" in host.partition("]")[0]:
        return [text]
    base, colon, port = host.rpartition(":")
    if not colon or "]" in port or "[" in port:
        base, colon, port = host, "", ""
    return [f"{user}{at}{name}{colon}{port}" for name in expand_hostlist(base)]


def parse_destination(text: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` or `[user@][v6addr]:port` -> (user, host, port)."""
    original = text
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
        if not user:
            raise UserError(f"bad host {clip_repr(original)}: empty user name")
    port_text = None
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise UserError(f"bad host {clip_repr(original)}: expected [address]:port")
        port_text = rest[1:] or None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host = text
    if not host or any(c.isspace() for c in host):
        raise UserError(f"bad host {clip_repr(original)}")
    return user, host, _port(port_text, original) if port_text is not None else None


def _port(value: Any, what: str) -> int:
    """A TCP port: a whole number 1-65535 (`22.7`, `true` and `0x16` are refused)."""
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())
    ):
        raise UserError(f"bad port {clip_repr(value)} in {clip_repr(what)}: must be a whole number")
    port = int(value)
    if not 1 <= port <= 65535:
        raise UserError(f"bad port {clip_repr(value)} in {clip_repr(what)}: must be 1-65535")
    return port


def _unique_names(specs: list[NodeSpec]) -> list[NodeSpec]:
    """Name nodes by host; where hosts repeat (ports differ), by host:port."""
    seen: dict[str, int] = {}
    for s in specs:
        seen[s.name] = seen.get(s.name, 0) + 1
    out = []
    for s in specs:
        if seen[s.name] > 1 and s.port:
            s = NodeSpec(**{**s.__dict__, "name": f"{s.host}:{s.port}"})
        out.append(s)
    names = [s.name for s in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"node listed twice: {', '.join(dupes)}")
    return out


def parse_hosts(text: str) -> list[NodeSpec]:
    """`--hosts [user@]host[:port],...` (Slurm hostlists: `n[1-4,7]`) -> SSH node specs."""
    specs = []
    for item in split_hostlist(text):
        for dest in expand_destinations(item):
            user, host, port = parse_destination(dest)
            specs.append(NodeSpec(name=host, transport="ssh", host=host, port=port, user=user))
    if not specs:
        raise UserError("--hosts names no host")
    return _unique_names(specs)


# --------------------------------------------------------------------------------------
# --inventory


class _Mapping(dict[Any, Any]):
    """A YAML mapping that remembers the line of itself and of each key."""

    line = 0
    key_lines: dict[Any, int]


class _Sequence(list[Any]):
    line = 0
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> Any:
    data = _Mapping()
    data.line = node.start_mark.line + 1
    data.key_lines = {}
    yield data
    data.update(loader.construct_mapping(node, deep=True))
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            data.key_lines[key_node.value] = key_node.start_mark.line + 1


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> Any:
    data = _Sequence()
    data.line = node.start_mark.line + 1
    data.item_lines = [item.start_mark.line + 1 for item in node.value]
    yield data
    data.extend(loader.construct_sequence(node, deep=True))


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


class _Where:
    """Formats `file:line: message` errors."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, line: int, message: str) -> UserError:
        return UserError(f"{self.path}:{line}: {message}")


def _line_of(container: Any, key: Any = None, default: int = 1) -> int:
    if isinstance(container, _Mapping):
        return container.key_lines.get(key, container.line) if key is not None else container.line
    if isinstance(container, _Sequence):
        if isinstance(key, int) and 0 <= key < len(container.item_lines):
            return container.item_lines[key]
        return container.line
    return default


def _check_fields(where: _Where, entry: _Mapping, allowed: set[str], what: str) -> None:
    for key in entry:
        if key not in allowed:
            raise where.error(
                _line_of(entry, key),
                f"unknown {what} field {clip_repr(key)} (known: {', '.join(sorted(allowed))})",
            )


def _string(where: _Where, entry: _Mapping, key: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise where.error(_line_of(entry, key), f"{key} must be a string, got {clip_repr(value)}")
    return str(value)


def _node_fields(where: _Where, entry: _Mapping, what: str) -> dict[str, Any]:
    """The connection fields of a node or the defaults section, validated."""
    out: dict[str, Any] = {}
    for key in ("user", "identity_file", "python", "host", "name"):
        if key in entry:
            out[key] = _string(where, entry, key)
    if "port" in entry:
        try:
            out["port"] = _port(entry["port"], what)
        except UserError as exc:
            raise where.error(_line_of(entry, "port"), str(exc)) from None
    if "jump" in entry and "proxy_jump" in entry:
        raise where.error(_line_of(entry, "proxy_jump"), "give either jump or proxy_jump, not both")
    for key in ("jump", "proxy_jump"):
        if key in entry:
            out["proxy_jump"] = _string(where, entry, key)
    return out


def load_inventory(path: str | Path, groups: Iterable[str] | None = None) -> list[NodeSpec]:
    """Node specs from a cluster.yaml, optionally only those in the named groups."""
    path = Path(path).expanduser()
    where = _Where(path)
    text = safe_yaml.read_text(path, "inventory")
    try:
        doc = safe_yaml.load(text, _LineLoader)  # a SafeLoader subclass: no object tags
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.context_mark and exc.problem:
            problem += f" ({exc.context} on line {exc.context_mark.line + 1})"
        raise where.error(line, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: invalid YAML: {clip(exc)}") from None
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
    if not isinstance(doc, _Mapping):
        raise where.error(1, "expected a mapping with a 'nodes' list")
    _check_fields(where, doc, TOP_LEVEL, "top-level")

    defaults = doc.get("defaults") or _Mapping()
    if not isinstance(defaults, _Mapping):
        raise where.error(_line_of(doc, "defaults"), "defaults must be a mapping")
    _check_fields(where, defaults, DEFAULT_FIELDS, "defaults")
    base = _node_fields(where, defaults, "defaults")

    raw_nodes = doc.get("nodes")
    if raw_nodes is None:
        raise where.error(doc.line, "no 'nodes' section")
    entries: list[tuple[int, Any]] = []
    if isinstance(raw_nodes, _Sequence):
        entries = [(_line_of(raw_nodes, i), item) for i, item in enumerate(raw_nodes)]
    elif isinstance(raw_nodes, _Mapping):
        for name, item in raw_nodes.items():
            line = _line_of(raw_nodes, name)
            if item is None:
                item = _Mapping({"host": name})
                item.line, item.key_lines = line, {}
            if not isinstance(item, _Mapping):
                raise where.error(line, f"node {clip_repr(name)} must be a mapping of fields")
            if "name" not in item:
                item["name"] = str(name)
            entries.append((line, item))
    else:
        raise where.error(_line_of(doc, "nodes"), "nodes must be a list or a mapping")

    specs: list[NodeSpec] = []
    member_of: dict[str, list[str]] = {}
    for line, item in entries:
        if isinstance(item, str):
            try:
                expanded = expand_destinations(item.strip())
                parsed = [parse_destination(d) for d in expanded]
            except UserError as exc:
                raise where.error(line, str(exc)) from None
            for user, host, port in parsed:
                fields = {**base, "host": host, "name": host}
                if user:
                    fields["user"] = user
                if port:
                    fields["port"] = port
                specs.append(_spec(where, line, fields))
            continue
        if not isinstance(item, _Mapping):
            raise where.error(
                line, f"a node must be a host string or a mapping, got {clip_repr(item)}"
            )
        _check_fields(where, item, NODE_FIELDS, "node")
        fields = {**base, **_node_fields(where, item, "node")}
        if not fields.get("host") and not fields.get("name"):
            raise where.error(item.line, "node has neither host nor name")
        fields.setdefault("host", fields.get("name"))
        fields["host"] = fields["host"] or fields.get("name")
        fields["name"] = fields.get("name") or fields["host"]
        node_groups = item.get("groups") or []
        if isinstance(node_groups, str):
            node_groups = [node_groups]
        if not isinstance(node_groups, list) or not all(isinstance(g, str) for g in node_groups):
            raise where.error(_line_of(item, "groups"), "groups must be a list of names")
        for g in node_groups:
            member_of.setdefault(fields["name"], []).append(g)
        specs.append(_spec(where, item.line, fields))

    names = [s.name for s in specs]
    for name in names:
        if names.count(name) > 1:
            raise where.error(raw_nodes.line, f"node {clip_repr(name)} is listed twice")

    raw_groups = doc.get("groups") or _Mapping()
    if not isinstance(raw_groups, _Mapping):
        raise where.error(_line_of(doc, "groups"), "groups must be a mapping of name -> nodes")
    for group, members in raw_groups.items():
        line = _line_of(raw_groups, group)
        if isinstance(members, str):
            members = [m.strip() for m in members.split(",") if m.strip()]
        if not isinstance(members, list):
            raise where.error(line, f"group {clip_repr(group)} must be a list of node names")
        for member in members:
            for name in expand_hostlist(str(member)):
                if name not in names:
                    raise where.error(
                        line, f"group {clip_repr(group)} names unknown node {clip_repr(name)}"
                    )
                member_of.setdefault(name, []).append(str(group))

    specs = [
        NodeSpec(**{**s.__dict__, "groups": tuple(dict.fromkeys(member_of.get(s.name, [])))})
        for s in specs
    ]
    if groups:
        wanted = list(groups)
        known = {g for s in specs for g in s.groups}
        unknown = [g for g in wanted if g not in known]
        if unknown:
            raise UserError(
                f"{path}: no group {', '.join(unknown)} "
                f"(groups: {', '.join(sorted(known)) or 'none'})"
            )
        specs = [s for s in specs if set(s.groups) & set(wanted)]
    if not specs:
        raise UserError(f"{path}: the inventory lists no nodes")
    return specs


def _spec(where: _Where, line: int, fields: dict[str, Any]) -> NodeSpec:
    return NodeSpec(
        name=str(fields["name"]),
        transport="ssh",
        host=str(fields["host"]),
        port=fields.get("port"),
        user=fields.get("user"),
        identity_file=fields.get("identity_file"),
        proxy_jump=fields.get("proxy_jump"),
        python=fields.get("python") or "python3",
    )
