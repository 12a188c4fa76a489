"""EOS token ids and tokenizers found next to a dump (the model's own config files)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

EOS_CONFIG_FILES = ("generation_config.json", "config.json", "tokenizer_config.json")


def find_eos_token_ids(path: str) -> tuple[list[int] | None, str | None]:
    """EOS ids and where they came from: (ids, source), or (None, None).

    Looked for in `generation_config.json` / `config.json` / `tokenizer_config.json` in the
    dump's directory or its parent, then through the experiment's `config.yaml`: next to
    the dump, or in AReaL's log directory of the trial the dump belongs to (the dump's
    default place is `<fileroot>/<experiment>/<trial>/debug_trajectories/`, the config's
    `<fileroot>/logs/<user>/<experiment>/<trial>/config.yaml`), whose `tokenizer_path` or
    `actor.path` names the model directory holding those files.
    """
    start = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for directory in (start, os.path.dirname(start)):
        found = _eos_in_model_dir(directory)
        if found[0]:
            return found
    for config in _experiment_configs(start):
        for model_dir in _model_dirs_from_config(config):
            ids, source = _eos_in_model_dir(model_dir)
            if ids:
                return ids, f"{source} (via {config})"
    return None, None


def _eos_in_model_dir(directory: str) -> tuple[list[int] | None, str | None]:
    for name in EOS_CONFIG_FILES:
        candidate = os.path.join(directory, name)
        ids = _eos_from_config(candidate)
        if ids:
            return ids, candidate
    return None, None


def _experiment_configs(start: str) -> list[str]:
    """`config.yaml` files of the experiment a dump directory belongs to."""
    out = [os.path.join(d, "config.yaml") for d in (start, os.path.dirname(start))]
    trial_dir = os.path.dirname(start)
    trial = os.path.basename(trial_dir)
    experiment = os.path.basename(os.path.dirname(trial_dir))
    fileroot = os.path.dirname(os.path.dirname(trial_dir))
    logs = os.path.join(fileroot, "logs")
    if trial and experiment and os.path.isdir(logs):
        with contextlib.suppress(OSError):
            for user in sorted(os.listdir(logs)):
                out.append(os.path.join(logs, user, experiment, trial, "config.yaml"))
    return [c for c in out if os.path.isfile(c)]


def _model_dirs_from_config(path: str) -> list[str]:
    """`tokenizer_path` and `actor.path` of an AReaL config.yaml (as `save_config` writes it)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError:
        return []
    found: dict[str, str] = {}
    section = ""
    # yaml.dump(asdict(cfg), default_flow_style=False): top-level keys at column 0, their
    # fields indented by two; read just the two keys, without needing PyYAML on the node.
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        value = value.strip().strip("'\"")
        if indent == 0:
            section = key
            if key == "tokenizer_path" and value:
                found["tokenizer_path"] = value
        elif indent == 2 and section == "actor" and key == "path" and value:
            found["actor.path"] = value
    dirs = [found[k] for k in ("tokenizer_path", "actor.path") if k in found]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _eos_from_config(path: str) -> list[int] | None:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    value = config.get("eos_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return list(value)
    # tokenizer_config.json names the token; its id is in added_tokens_decoder.
    token = config.get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    decoder = config.get("added_tokens_decoder")
    if isinstance(token, str) and isinstance(decoder, dict):
        for tid, entry in decoder.items():
            if isinstance(entry, dict) and entry.get("content") == token and str(tid).isdigit():
                return [int(tid)]
    return None


def decoder_for(path: str) -> Any:
    """A tokenizer saved next to the dump (or one level up), loaded from local files only.

    Uses `tokenizers` when installed, else `transformers`; None (token ids are shown) when
    neither is installed or no tokenizer files are there. Never downloads anything.
    """
    start = os.path.dirname(os.path.abspath(path))
    for directory in (start, os.path.dirname(start)):
        candidate = os.path.join(directory, "tokenizer.json")
        if not os.path.exists(candidate):
            continue
        try:
            from tokenizers import Tokenizer

            return Tokenizer.from_file(candidate)
        except ImportError:
            pass
        except Exception:  # a broken tokenizer file must not break the view
            return None
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception:  # not installed, or files it cannot read: show token ids
            return None
    return None
