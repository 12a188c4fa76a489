"""The staleness settings of a running AReaL job, read as AReaL reads its config.

At AReaL cbff54d `load_expr_config` (areal/api/cli_args.py:3544-3559) composes the
`--config` YAML with the command line's overrides (`parse_cli_args`, :3474-3498: Hydra's
compose, overrides win), merges that over the dataclasses' defaults
(`to_structured_cfg`, :3534-3541) and resolves `${...}` interpolations
(`OmegaConf.to_object`). Rank 0 then saves the result, every value resolved, as
`config.yaml` in the run's log directory `<fileroot>/logs/<user>/<experiment>/<trial>`
(`save_config`, :3555-3557, :3568-3577; the directory is `StatsLogger.get_log_path`,
areal/utils/stats_logger.py:165-181).

So, lowest first: AReaL's defaults, the `--config` file, the saved `config.yaml` (the
whole resolved config of the run), the command line's overrides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from areal_node.constants import config_key

from areal_console.core.common.errors import UserError

# AReaL's defaults (areal/api/cli_args.py:2487-2509 at cbff54d): max_concurrent_rollouts
# None (= consumer_batch_size), consumer_batch_size 1, max_head_offpolicyness 0.
DEFAULTS: dict[str, int | None] = {
    "rollout.max_head_offpolicyness": 0,
    "rollout.consumer_batch_size": 1,
    "rollout.max_concurrent_rollouts": None,
}
NULLABLE = {"rollout.max_concurrent_rollouts"}
# Text keys read beside them: the actor's allocation, whose data-parallel size divides the
# capacity in SPMD mode (`TrainEngineConfig.backend`, cli_args.py:1410-1416, required).
TEXT_KEYS: dict[str, str | None] = {config_key("actor.backend"): None}
MAX_TEXT = 200
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z0-9_.]{1,200})\}$")
MAX_HOPS = 8


def config_paths(cmdline: str) -> list[str]:
    """The `--config` file a command line names (`--config F` or `--config=F`)."""
    argv = cmdline.split()
    out = []
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--config="):
            out.append(arg.partition("=")[2])
    return [p for p in out if p]


def _lookup(doc: Any, dotted: str) -> tuple[bool, Any]:
    node = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _value(doc: Any, key: str) -> tuple[bool, Any]:
    """The value at `key`, following `${a.b}` interpolations within the document (one
    that names no key stays as its text)."""
    found, value = _lookup(doc, key)
    for _ in range(MAX_HOPS):
        if not (found and isinstance(value, str)):
            break
        m = _INTERPOLATION.match(value.strip())
        if m is None:
            break
        hit, target = _lookup(doc, m.group(1))
        if not hit:
            break
        value = target
    return found, value


def _number(key: str, value: Any) -> tuple[bool, int | None]:
    if value is None:
        return key in NULLABLE, None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31:
        return True, value
    return False, None


def _text(value: Any) -> tuple[bool, str | None]:
    if isinstance(value, str) and 0 < len(value) <= MAX_TEXT and value.isprintable():
        return True, value
    return False, None


def parse_yaml(text: str) -> dict[str, Any]:
    """A config document (an error in it: UserError)."""
    import yaml  # a run's config is parsed only when one was found (yaml costs a start)

    from areal_console.core.common.safe_yaml import load

    try:
        doc = load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"not YAML: {str(exc).splitlines()[0][:200]}") from None
    except ValueError as exc:  # an alias bomb, too deep
        raise UserError(str(exc)[:200]) from None
    if not isinstance(doc, dict):
        raise UserError("not a YAML mapping")
    return doc


def _override(value: str) -> tuple[bool, int | None]:
    if value in ("null", "None"):
        return True, None
    if value.isascii() and value.isdigit() and len(value) < 10:
        return True, int(value)
    return False, None


def staleness_config(
    cmdlines: Iterable[str], documents: Iterable[tuple[str, str]] = ()
) -> tuple[dict[str, Any], list[str]]:
    """Each staleness key's `{"value", "from"}`, and notes on what could not be used.
    `documents` are (where, YAML text), lowest precedence first."""
    found: dict[str, Any] = {
        k: {"value": v, "from": "AReaL's default"} for k, v in DEFAULTS.items()
    }
    found.update({k: {"value": v, "from": "not set"} for k, v in TEXT_KEYS.items()})
    notes = []
    for where, text in documents:
        try:
            doc = parse_yaml(text)
        except UserError as exc:
            notes.append(f"{where}: {exc}")
            continue
        for key in (*DEFAULTS, *TEXT_KEYS):
            present, raw = _value(doc, key)
            if not present:
                continue
            ok, value = _text(raw) if key in TEXT_KEYS else _number(key, raw)
            if ok:
                found[key] = {"value": value, "from": where}
            else:
                what = "text" if key in TEXT_KEYS else "a count"
                notes.append(f"{where}: {key} = {str(raw)[:80]!r} is not {what}: not used")
    overridden: set[str] = set()
    for cmd in cmdlines:
        for arg in cmd.split():
            key, eq, raw = arg.lstrip("+").partition("=")
            if not eq or key not in (*DEFAULTS, *TEXT_KEYS) or key in overridden:
                continue
            ok, value = _text(raw.strip("'\"")) if key in TEXT_KEYS else _override(raw)
            if ok and (value is not None or key in NULLABLE):
                found[key] = {"value": value, "from": "command line"}
                overridden.add(key)
    return found, notes
