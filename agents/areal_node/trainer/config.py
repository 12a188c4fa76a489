"""The reference trainer's configuration: defaults < recording (replay only) < --config
file < key=value, under AReaL's key names. Standard library only."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from areal_node.trainer.layout import format_steps, read_meta, scan_checkpoints, scan_dumps

TRAINER_NAME = "areal-console reference trainer"
TRAINER_VERSION = 1

DEFAULTS: dict[str, Any] = {
    "steps": 4,
    # Steps are numbered as AReaL's global_step, from 0; `steps` of them run (AReaL's
    # total_train_steps). `start_step` is this trainer's own: AReaL's replay always starts
    # at 0 (or after a recovered checkpoint).
    "start_step": 0,
    "seed": 1,
    "threads": 1,
    "output_dir": "",
    "train_dataset": {"batch_size": 4},
    "gconfig": {"n_samples": 4, "max_new_tokens": 3, "temperature": 1.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2},
    # Names as in AReaL's PPOConfig (areal/api/cli_args.py).
    "actor": {
        "optimizer": {"lr": 0.01, "gradient_clipping": 1.0},
        "eps_clip": 0.2,
        "rejection_sampling": {"level": "token", "action": "mask", "metric": "ratio", "upper": 5.0},
        "use_decoupled_loss": True,
        "ppo_n_minibatches": 2,
    },
    "rollout": {"max_head_offpolicyness": 1},
    "trajectory_debug": {
        "dump_rollout_data": False,
        "replay_rollout_data": False,
        "path": "",
        "dump_steps": None,
        "max_keep": None,
        "pin_steps": [],
        "dump_scope": "rollout",
        "save_checkpoints": True,
    },
    # AReaL's key: where rank 0 writes tensorboard events (step = global step from 0).
    "stats_logger": {"tensorboard": {"path": None}},
    # After the last step, stop making progress the way broken jobs do (for the demo and
    # for practising with the console): none | cleanup | mismatch | collective.
    # flight_recorder: on CPU (gloo) with several ranks, record every collective with
    # torch's Flight Recorder and serve the record to the console (bookkeeping only).
    "debug": {"hang": "none", "flight_recorder": True},
}

HANG_PATTERNS = ("none", "cleanup", "mismatch", "collective")

# Keys a replay does not inherit from the recording's configuration.
NOT_INHERITED = (
    "steps",
    "start_step",
    "output_dir",
    "threads",
    "trajectory_debug",
    "debug",
    "stats_logger",
)


class ConfigError(Exception):
    """A configuration or input problem the user can fix (printed as one line)."""


# Configuration: defaults < recording (replay only) < --config file < key=value


def parse_scalar(text: str) -> Any:
    """A YAML-ish scalar or inline list: true/false/null, numbers, [a, b], or a string."""
    value = text.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    low = value.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "none", "~", ""):
        return None
    if value.startswith("[") and value.endswith("]"):
        inner = value[1:-1].strip()
        return [parse_scalar(part) for part in inner.split(",")] if inner else []
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_config_text(text: str) -> dict[str, Any]:
    """JSON, or the YAML subset configs use: nested `key: value` mappings by indentation."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ConfigError("config file must hold a mapping")
        return data
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, rest = line.strip().partition(":")
        if not sep or not key:
            raise ConfigError(f"config line {lineno}: expected 'key: value', got {raw.strip()!r}")
        while stack and indent <= stack[-1][0]:
            stack.pop()
        if not stack:
            raise ConfigError(f"config line {lineno}: bad indentation")
        parent = stack[-1][1]
        if rest.strip():
            parent[key.strip()] = parse_scalar(rest)
        else:
            child: dict[str, Any] = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return root


def set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = config
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def check_known_keys(config: dict[str, Any]) -> None:
    known = set(flatten(DEFAULTS))
    # A section may be switched off as a whole (`actor.rejection_sampling=null`).
    sections = {k.rsplit(".", i)[0] for k in known for i in range(1, k.count(".") + 1)}
    unknown = sorted(
        k
        for k, v in flatten(config).items()
        if k not in known and not (v is None and k in sections)
    )
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def check_value_types(config: dict[str, Any]) -> None:
    """A number where the default is a number, true/false where it is true/false (a word
    for `actor.eps_clip` failed deep in the first step, with a traceback)."""
    defaults = flatten(DEFAULTS)
    for key, value in flatten(config).items():
        default = defaults.get(key)
        if value is None or default is None:
            continue
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false, got {value!r}")
        elif isinstance(default, (int, float)):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or (isinstance(default, int) and not isinstance(value, int)):
                kind = "an integer" if isinstance(default, int) else "a number"
                raise ConfigError(f"{key} must be {kind}, got {value!r}")


# The smallest value each number may take, and whether it may equal it (a zero count of
# samples, heads or threads failed in the first step with a traceback).
LOWER_BOUNDS: dict[str, tuple[float, bool]] = {
    "threads": (1, True),
    "train_dataset.batch_size": (1, True),
    "gconfig.n_samples": (1, True),
    "gconfig.max_new_tokens": (1, True),
    "gconfig.temperature": (0, False),
    "model.d_model": (1, True),
    "model.n_layers": (0, True),
    "model.n_heads": (1, True),
    "actor.optimizer.lr": (0, True),
    "actor.optimizer.gradient_clipping": (0, True),
    "actor.eps_clip": (0, True),
    "actor.ppo_n_minibatches": (1, True),
    "actor.rejection_sampling.upper": (0, False),
    "rollout.max_head_offpolicyness": (0, True),
}


def check_value_ranges(config: dict[str, Any]) -> None:
    """Each number within `LOWER_BOUNDS`; the model's width a multiple of its heads."""
    values = flatten(config)
    for key, (low, inclusive) in LOWER_BOUNDS.items():
        value = values.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if value < low or (value == low and not inclusive):
            bound = f">= {low:g}" if inclusive else f"> {low:g}"
            raise ConfigError(f"{key} must be {bound}, got {value!r}")
    width, heads = values.get("model.d_model"), values.get("model.n_heads")
    if isinstance(width, int) and isinstance(heads, int) and heads and width % heads:
        raise ConfigError(
            f"model.d_model must be a multiple of model.n_heads, got d_model={width} "
            f"n_heads={heads}"
        )


def check_overrides(overrides: list[str]) -> None:
    """`key=value` overrides alone: known keys, values of the right kind and range
    (ConfigError). What the console checks before it launches a replay of this trainer."""
    config = _dotted(overrides)
    check_known_keys(config)
    check_value_types(config)
    check_value_ranges(config)


def _dotted(overrides: list[str]) -> dict[str, Any]:
    dotted: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {item!r}")
        set_dotted(dotted, key.strip(), parse_scalar(value))
    return dotted


def _steps_list(value: Any, name: str) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ConfigError(f"{name} must be a list of step numbers, got {value!r}")
    if any(v < 0 for v in value):
        raise ConfigError(f"{name} must be non-negative, got {value!r}")
    return sorted(set(value))


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Check the whole configuration; raise ConfigError with one clear line."""
    check_known_keys(config)
    check_value_types(config)
    check_value_ranges(config)
    td = config["trajectory_debug"]
    if td["dump_rollout_data"] and td["replay_rollout_data"]:
        raise ConfigError(
            "trajectory_debug.dump_rollout_data and trajectory_debug.replay_rollout_data "
            "are mutually exclusive: set only one"
        )
    if (td["dump_rollout_data"] or td["replay_rollout_data"]) and not td["path"]:
        raise ConfigError("trajectory_debug.path is required to dump or replay rollout data")
    td["dump_steps"] = _steps_list(td["dump_steps"], "trajectory_debug.dump_steps")
    td["pin_steps"] = _steps_list(td["pin_steps"], "trajectory_debug.pin_steps") or []
    if td["max_keep"] is not None and (not isinstance(td["max_keep"], int) or td["max_keep"] <= 0):
        raise ConfigError(
            f"trajectory_debug.max_keep must be a positive integer, got {td['max_keep']!r}"
        )
    if td["dump_scope"] not in ("rollout", "full"):
        raise ConfigError(
            f"trajectory_debug.dump_scope must be 'rollout' or 'full', got {td['dump_scope']!r}"
        )
    rs = config["actor"]["rejection_sampling"]
    if rs is not None:
        if (rs["level"], rs["metric"]) != ("token", "ratio") or rs["action"] not in (
            "mask",
            "clamp",
        ):
            raise ConfigError(
                "this trainer supports actor.rejection_sampling with level=token, metric=ratio "
                f"and action mask or clamp, got {rs!r}"
            )
        if not isinstance(rs["upper"], (int, float)) or isinstance(rs["upper"], bool):
            raise ConfigError(
                f"actor.rejection_sampling.upper must be a number, got {rs['upper']!r}"
            )
    if config["debug"]["hang"] not in HANG_PATTERNS:
        raise ConfigError(
            f"debug.hang must be one of {', '.join(HANG_PATTERNS)}, got {config['debug']['hang']!r}"
        )
    if not isinstance(config["debug"]["flight_recorder"], bool):
        raise ConfigError(
            f"debug.flight_recorder must be true or false, got {config['debug']['flight_recorder']!r}"
        )
    for key in ("steps", "start_step", "seed", "threads"):
        if not isinstance(config[key], int) or isinstance(config[key], bool):
            raise ConfigError(f"{key} must be an integer, got {config[key]!r}")
    if config["steps"] < 1 or config["start_step"] < 0 or config["start_step"] >= config["steps"]:
        raise ConfigError(
            "need 0 <= start_step < steps (global steps start at 0), got "
            f"start_step={config['start_step']} steps={config['steps']}"
        )
    if config["start_step"] > 0 and not td["replay_rollout_data"]:
        raise ConfigError("start_step > 0 needs trajectory_debug.replay_rollout_data=true")
    return config


def load_config(config_file: str | None, overrides: list[str]) -> dict[str, Any]:
    """Defaults, then (in replay) the recording's model/actor settings, the file, the overrides."""
    layers: list[dict[str, Any]] = []
    if config_file:
        try:
            with open(config_file, encoding="utf-8") as fh:
                layers.append(parse_config_text(fh.read()))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
    layers.append(_dotted(overrides))
    config = copy.deepcopy(DEFAULTS)
    for layer in layers:
        config = merge(config, layer)
    td = config["trajectory_debug"]
    if td.get("replay_rollout_data") and not td.get("dump_rollout_data") and td.get("path"):
        recorded = read_meta(str(td["path"])).get("config", {})
        inherited = {k: v for k, v in recorded.items() if k not in NOT_INHERITED}
        config = merge(DEFAULTS, inherited)
        for layer in layers:
            config = merge(config, layer)
    return validate(config)


def check_replay_input(directory: str, first: int, last: int, world_size: int) -> None:
    """Every step in [first, last] is dumped for this DP size, and `first` can be started at."""
    if not os.path.isdir(directory):
        raise ConfigError(f"trajectory_debug.path {directory} is not a directory")
    dumps = scan_dumps(directory)
    if not dumps:
        raise ConfigError(f"no step_*.pt dumps in {directory}")
    available = format_steps(list(dumps))
    for step in range(first, last + 1):
        if step not in dumps:
            raise ConfigError(
                f"no dump for step {step} in {directory}; available steps: {available}"
            )
        ranks = dumps[step]
        expected: set[int | None] = {None} if world_size == 1 else set(range(world_size))
        if ranks != expected:
            dp = 1 if ranks == {None} else len(ranks)
            raise ConfigError(
                f"step {step} was dumped with {dp} data-parallel rank(s) but this run has "
                f"{world_size}: replay with --nproc {dp}"
            )
    if first > 0 and first not in scan_checkpoints(directory):
        ckpts = format_steps(scan_checkpoints(directory))
        raise ConfigError(
            f"cannot start replay at step {first}: no checkpoint saved with the dump at that "
            f"step (checkpoints: {ckpts}); start at step 0 or at a checkpointed step"
        )
