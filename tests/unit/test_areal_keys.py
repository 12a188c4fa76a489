"""Every AReaL config key the console suggests exists in AReaL's config classes.

The fields come from AReaL's `areal/api/cli_args.py`, parsed with `ast` by
scripts/areal_config_fields.py into tests/data (the commit is in each file): main at
cbff54d6, and pull request #1407 (the trajectory dump/replay keys, not merged there).
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest
from areal_node import constants

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
FIELDS = {
    constants.MAIN: DATA / "areal_cli_args_cbff54d6.json",
    constants.PR_1407: DATA / "areal_cli_args_pr1407_6250a6e8.json",
}
# Config sections (PPOConfig / BaseExperimentConfig fields holding a config class) whose
# keys users set on the command line; a dotted name under one of them in the console's
# text is a suggestion to set that key.
SECTIONS = (
    "actor",
    "rollout",
    "gconfig",
    "eval_gconfig",
    "ref",
    "critic",
    "teacher",
    "stats_logger",
    "train_dataset",
    "valid_dataset",
    "saver",
    "recover",
    "evaluator",
    "trajectory_debug",
)
_SECTIONS = "|".join(SECTIONS)
KEY = re.compile(rf"(?<![\w./-])(?:{_SECTIONS})\.[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*(?![\w(])")
FILE_SUFFIXES = (".py", ".yaml", ".md", ".json", ".log")


def _load(where: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIELDS[where].read_text())
    return data


def resolve(dotted: str, data: dict[str, Any]) -> bool:
    """Whether `dotted` names a field, walking config classes from PPOConfig."""
    classes = data["classes"]

    def fields(name: str) -> dict[str, str]:
        out: dict[str, str] = {}
        cls = classes.get(name)
        if cls is None:
            return out
        for base in cls["bases"]:
            out.update(fields(base))
        out.update(cls["fields"])
        return out

    current = data["root"]
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        known = fields(current)
        if part not in known:
            return False
        if i == len(parts) - 1:
            return True
        # `PPOActorConfig | None` -> PPOActorConfig
        names = [t.strip() for t in re.split(r"[|\[\],]", known[part]) if t.strip()]
        nested = [n for n in names if n in classes]
        if not nested:
            return False
        current = nested[0]
    return False


def test_field_lists_name_their_commits() -> None:
    main, pr = _load(constants.MAIN), _load(constants.PR_1407)
    assert main["commit"] == constants.AREAL_COMMIT
    assert pr["commit"] == constants.AREAL_PR_1407_COMMIT
    assert main["file"] == "areal/api/cli_args.py" and "RejectionSamplingConfig" in main["classes"]
    assert "TrajectoryDebugConfig" not in main["classes"]  # not merged at that commit
    assert "TrajectoryDebugConfig" in pr["classes"]


@pytest.mark.parametrize("key", sorted(constants.AREAL_KEYS))
def test_every_registered_key_exists_in_areal(key: str) -> None:
    where, _ = constants.AREAL_KEYS[key]
    assert resolve(key, _load(where)), f"{key} is not a field of AReaL's config ({where})"
    if where == constants.PR_1407:
        assert not resolve(key, _load(constants.MAIN)), f"{key} is on main now: mark it so"


def test_resolver_rejects_the_names_areal_removed_or_moved() -> None:
    main = _load(constants.MAIN)
    assert not resolve("actor.behav_imp_weight_cap", main)
    assert not resolve("actor.behave_imp_weight_cap", main)
    assert not resolve("actor.max_head_offpolicyness", main)
    assert resolve("rollout.max_head_offpolicyness", main)
    assert resolve("actor.rejection_sampling.upper", main)
    with pytest.raises(KeyError):
        constants.config_key("actor.behav_imp_weight_cap")


def _suggestion_text(path: Path) -> str:
    """Docs whole; of Python source only strings and comments (where suggestions live)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    parts = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT) or (
            hasattr(tokenize, "FSTRING_MIDDLE") and tok.type == tokenize.FSTRING_MIDDLE
        ):
            parts.append(tok.string)
    return "\n".join(parts)


def suggested_keys() -> dict[str, set[str]]:
    files = [
        *ROOT.joinpath("tui").rglob("*.py"),
        *ROOT.joinpath("agents").rglob("*.py"),
        *ROOT.joinpath("docs").rglob("*.md"),
        ROOT / "README.md",
    ]
    found: dict[str, set[str]] = {}
    for path in files:
        for m in KEY.finditer(_suggestion_text(path)):
            key = m.group(0)
            if not key.endswith(FILE_SUFFIXES):
                found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


# Named on purpose as keys nobody has: the docs' example of an override the trainer refuses.
NOT_KEYS_ON_PURPOSE = {"actor.nope"}


def test_every_key_the_console_names_exists_in_areal() -> None:
    """Warnings, diagnoses, templates, docs: any `section.key` they name is AReaL's."""
    main, pr = _load(constants.MAIN), _load(constants.PR_1407)
    found = suggested_keys()
    assert "rollout.max_head_offpolicyness" in found  # the scan sees the registry's users
    bad = {
        key: sorted(where)
        for key, where in found.items()
        if not resolve(key, main)
        and not (key.startswith("trajectory_debug.") and resolve(key, pr))
        and key not in constants.REFERENCE_TRAINER_KEYS
        and key not in NOT_KEYS_ON_PURPOSE
    }
    assert not bad, f"keys AReaL does not have: {bad}"
