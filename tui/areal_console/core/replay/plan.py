"""Replay launch plans and verification of a replay against its recording.

Pure functions over data: a dump directory's index (from the node agent's `replay_index`
op), the node's GPU sample, and metrics JSONL text. Nothing here talks to a node; the
`replay` command and the Runs screen do that with what these functions return.

Launch commands are argv lists built token by token from a template: a file name or a
field typed into the UI is only ever one argv element, never parsed by a shell.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from areal_node import launcher
from areal_node.agent.jobs import escape_placeholders, fill_placeholders
from areal_node.constants import METRIC_NAMES, METRICS_FILE, TRAINER_MODULE, config_key

from areal_console.core.common.errors import UserError
from areal_console.core.connection.payload import PACKAGE_DIR

# A node runs the reference trainer from the payload, staged under this name (run as a
# program, the payload is the trainer); this machine runs it from the node package.
TRAINER_FILE_NAME = "reference_trainer.pyz"

# Placeholders a template may use; each is substituted inside one argv element.
# Steps are AReaL's global steps (from 0): {start} and {end} are the first and last replayed,
# {stop} is one past the last (what a `total_train_steps`-style bound takes).
PLACEHOLDERS = ("python", "script", "config", "dir", "nproc", "start", "end", "stop", "job_dir")
STEP_PLACEHOLDERS = ("{start}", "{end}", "{stop}")

DEFAULT_TEMPLATES: dict[str, dict[str, str]] = {
    "reference": {
        "argv": (
            "{python} {script} --nproc {nproc} "
            "trajectory_debug.replay_rollout_data=true trajectory_debug.path={dir} "
            "start_step={start} steps={stop} output_dir={job_dir}/out"
        ),
        "metrics": f"{{job_dir}}/out/{METRICS_FILE}",
        "recorded_metrics": f"{{dir}}/{METRICS_FILE}",
    },
    # AReaL's replay has no start-step option: it trains from global step 0 (or after a
    # recovered checkpoint), loading step_{global_step:06d}.pt each step (PR #1407,
    # rl_trainer.py:660-716); plan_replay adds total_train_steps to stop after the dump.
    "areal": {
        "argv": (
            "{python} {script} --config {config} "
            f"{config_key('trajectory_debug.replay_rollout_data')}=true "
            f"{config_key('trajectory_debug.path')}={{dir}}"
        ),
    },
}


def local_trainer(
    *args: str, env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run the reference trainer on this machine with `args`:
    `python -m areal_node.trainer` on the node package this process imports, whose root
    goes first on PYTHONPATH (the trainer and its torchrun ranks import the same code)."""
    base = dict(os.environ if env is None else env)
    root = str(PACKAGE_DIR.parent)
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [root, base.get("PYTHONPATH")]))
    return launcher.user_module(sys.executable, TRAINER_MODULE, *args), launcher.clean_env(base)


# --------------------------------------------------------------------------------------
# Parsing user input


def parse_step_range(text: str | None) -> tuple[int | None, int | None]:
    """`A:B`, `A:`, `:B` or `N` -> (first, last); None means "from the dump"."""
    if text is None or not text.strip():
        return None, None
    value = text.strip()
    try:
        if ":" not in value:
            step = int(value)
            return step, step
        a, b = value.split(":", 1)
        first = int(a) if a.strip() else None
        last = int(b) if b.strip() else None
    except ValueError:
        raise UserError(f"bad step range {text!r}: use A:B, A:, :B or N") from None
    if (
        (first is not None and first < 0)
        or (last is not None and last < 0)
        or (first is not None and last is not None and last < first)
    ):
        raise UserError(f"bad step range {text!r}: need 0 <= A <= B (global steps start at 0)")
    return first, last


def parse_gpus(text: str | None) -> list[int] | None:
    """`0,1` -> [0, 1]; `cpu` -> []; None/empty -> None (choose free GPUs)."""
    if text is None or not text.strip():
        return None
    if text.strip().lower() == "cpu":
        return []
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UserError(f"bad GPU list {text!r}: use indices like 0,1 or 'cpu'")
        if int(part) in out:
            raise UserError(f"GPU {part} is listed twice in {text!r}")
        out.append(int(part))
    return out


def format_gpus(gpus: list[int]) -> str:
    return ",".join(map(str, gpus)) if gpus else "cpu"


def format_steps(steps: list[int]) -> str:
    """Compact ranges: [1, 2, 3, 5] -> "1-3,5"."""
    ordered = sorted(set(steps))
    if not ordered:
        return "none"
    runs: list[list[int]] = [[ordered[0], ordered[0]]]
    for s in ordered[1:]:
        if s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_overrides(overrides: list[str], template: LaunchTemplate | None = None) -> None:
    """Extra `key=value` for a replay: well formed, and never the dump flag as well; for the
    reference trainer, keys it knows with values of the right kind (a replay with
    `actor.nope=3` failed in its log only)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"expected key=value, got {item!r}")
        if key.strip().endswith("dump_rollout_data") and value.strip().lower() in (
            "true",
            "1",
            "yes",
            "on",
        ):
            raise UserError(
                "trajectory_debug.dump_rollout_data and trajectory_debug.replay_rollout_data "
                "are mutually exclusive: a replay cannot also dump"
            )
    if template is not None and template.name == "reference":
        from areal_node.trainer.config import ConfigError
        from areal_node.trainer.config import check_overrides as check_trainer_overrides

        try:
            check_trainer_overrides(overrides)
        except ConfigError as exc:
            raise UserError(f"overrides: {exc}") from None


# --------------------------------------------------------------------------------------
# What a dump directory holds


@dataclass
class DumpIndex:
    """A trajectory dump directory on a node, as its agent listed it."""

    path: str
    steps: dict[int, list[int | None]]  # step -> dp ranks present (None: no `_dp_` suffix)
    checkpoints: list[int] = field(default_factory=list)
    has_metrics: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_agent(cls, data: dict[str, Any]) -> DumpIndex:
        steps = {int(k): list(v) for k, v in (data.get("steps") or {}).items()}
        return cls(
            path=str(data["dir"]),
            steps=steps,
            checkpoints=sorted(int(s) for s in data.get("checkpoints") or []),
            has_metrics=bool(data.get("metrics")),
            meta=dict(data.get("meta") or {}),
        )

    @property
    def step_numbers(self) -> list[int]:
        return sorted(self.steps)

    def dp_size(self, step: int) -> int:
        ranks = self.steps[step]
        return 1 if ranks == [None] else len(ranks)

    @property
    def is_reference(self) -> bool:
        return str(self.meta.get("trainer", "")).startswith("areal-console")


def choose_steps(index: DumpIndex, first: int | None, last: int | None) -> tuple[int, int]:
    """The replayed range: every step dumped, with a checkpoint to start from."""
    available = index.step_numbers
    if not available:
        raise UserError(f"no step_*.pt dumps in {index.path}")
    listing = format_steps(available)
    if first is None:
        # Earliest step we can start at: step 0 or a checkpointed step.
        starts = [s for s in available if s == 0 or s in index.checkpoints]
        first = starts[0] if starts else available[0]
    if last is None:
        last = first
        while last + 1 in index.steps:
            last += 1
    for step in range(first, last + 1):
        if step not in index.steps:
            raise UserError(f"no dump for step {step} in {index.path}; available steps: {listing}")
    if first > 0 and index.is_reference and first not in index.checkpoints:
        raise UserError(
            f"cannot start at step {first}: no checkpoint was saved with that dump "
            f"(checkpoints: {format_steps(index.checkpoints)})"
        )
    return first, last


def takes_steps(template: LaunchTemplate) -> bool:
    """Whether a template can start a replay at a chosen step (AReaL's cannot)."""
    return any(p in token for token in template.argv for p in STEP_PLACEHOLDERS)


def areal_steps(index: DumpIndex) -> tuple[int, int]:
    """What AReaL's replay trains on: global step 0 up to the last of the steps dumped
    without a gap (it stops with FileNotFoundError at the first missing file)."""
    if not index.steps:
        raise UserError(f"no step_*.pt dumps in {index.path}")
    if 0 not in index.steps:
        raise UserError(
            f"AReaL's replay starts at global step 0 and {index.path} has no step 0 "
            f"(steps: {format_steps(index.step_numbers)}): it would stop at once with "
            "FileNotFoundError; dump from the start of the run, or replay with the reference "
            "template"
        )
    last = 0
    while last + 1 in index.steps:
        last += 1
    return 0, last


def check_dp_size(index: DumpIndex, first: int, last: int, ranks: int, exact: bool = True) -> int:
    """All replayed steps share one DP size, equal to `ranks` when given (>0).

    With `exact=False` (trainers whose ranks are not all data parallel, e.g. AReaL with
    tensor or pipeline parallelism) `ranks` only has to be at least the DP size.
    """
    sizes = {index.dp_size(s) for s in range(first, last + 1)}
    if len(sizes) > 1:
        raise UserError(
            f"steps {first}-{last} in {index.path} were dumped with different data-parallel "
            f"sizes {sorted(sizes)}"
        )
    size = sizes.pop()
    if ranks and (ranks != size if exact else ranks < size):
        raise UserError(
            f"the dump was made with {size} data-parallel rank(s), but {ranks} GPU(s) were "
            f"chosen: pick {size}" + ("" if exact else " or more")
        )
    return size


# --------------------------------------------------------------------------------------
# GPUs on the node


class NoGpuError(UserError):
    """GPUs were asked for on a node without any (the message is in CLI words)."""

    def __init__(self, message: str, node: str, why: str) -> None:
        super().__init__(message)
        self.node, self.why = node, why


def free_gpus(sample: dict[str, Any]) -> list[int]:
    """GPUs of a node sample with no process on them."""
    busy: set[int] = set()
    for proc in sample.get("processes") or []:
        busy.update(int(g) for g in proc.get("gpus") or [])
    return [int(g["index"]) for g in sample.get("gpus") or [] if int(g["index"]) not in busy]


def check_gpus(requested: list[int], sample: dict[str, Any], node: str) -> None:
    have = sorted(int(g["index"]) for g in sample.get("gpus") or [])
    missing = [g for g in requested if g not in have]
    if not missing:
        return
    if not have:
        why = sample.get("gpu_error") or "no GPUs found"
        raise NoGpuError(f"node {node} has no GPUs ({why}); use --gpus cpu", node, why)
    raise UserError(
        f"node {node} has no GPU {','.join(map(str, missing))} (it has {format_gpus(have)})"
    )


# --------------------------------------------------------------------------------------
# Templates and plans


@dataclass(frozen=True)
class LaunchTemplate:
    """How to start one kind of trainer in replay mode, with `{placeholder}` tokens."""

    name: str
    argv: tuple[str, ...]
    metrics: str | None = None
    recorded_metrics: str | None = None


def parse_template(name: str, spec: dict[str, Any] | str) -> LaunchTemplate:
    if isinstance(spec, str):
        spec = {"argv": spec}
    raw = spec.get("argv")
    tokens = shlex.split(raw) if isinstance(raw, str) else list(raw or [])
    if not tokens or not all(isinstance(t, str) for t in tokens):
        raise UserError(f"launch template {name!r} has no command")
    for token in tokens:
        for part in _placeholders(token):
            if part not in PLACEHOLDERS:
                raise UserError(
                    f"launch template {name!r} uses unknown placeholder {{{part}}} "
                    f"(known: {', '.join(PLACEHOLDERS)})"
                )
    return LaunchTemplate(
        name=name,
        argv=tuple(tokens),
        metrics=spec.get("metrics"),
        recorded_metrics=spec.get("recorded_metrics"),
    )


def _placeholders(token: str) -> list[str]:
    out: list[str] = []
    i = 0
    while True:
        start = token.find("{", i)
        if start < 0:
            return out
        end = token.find("}", start)
        if end < 0:
            return out
        out.append(token[start + 1 : end])
        i = end + 1


def load_templates(extra: dict[str, Any] | None = None) -> dict[str, LaunchTemplate]:
    """Built-in templates, overridden or extended by the settings' `launch_templates`."""
    specs: dict[str, Any] = dict(DEFAULT_TEMPLATES)
    specs.update(extra or {})
    return {name: parse_template(name, spec) for name, spec in specs.items()}


def substitute(token: str, values: dict[str, str]) -> str:
    """Fill known `{placeholders}` of one template element in one pass. Values are written
    with their braces doubled, so the later pass that fills `{job_dir}` on the node never
    looks inside them (a dump path containing `{job_dir}` stays as it is)."""
    return fill_placeholders(token, {k: escape_placeholders(v) for k, v in values.items()})


def resolve(token: str, job_dir: str | None = None) -> str:
    """A planned element as it runs: `{job_dir}` filled (when given), braces undoubled."""
    return fill_placeholders(token, {"job_dir": job_dir} if job_dir is not None else {})


@dataclass
class ReplayPlan:
    """Everything needed to start one replay on one node, shown before it runs."""

    node: str
    gpus: list[int]  # [] means CPU
    steps: tuple[int, int]
    argv: list[str]
    env: dict[str, str]
    dump_dir: str
    template: str
    nproc: int
    log: str = "{job_dir}/train.log"
    metrics: str | None = None
    recorded_metrics: str | None = None
    recorded_device: str | None = None  # "cuda" / "cpu" from the recording, when it says
    tolerance: float | None = None  # relative tolerance of a cross-device comparison

    @property
    def device(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def device_note(self) -> str:
        """Which device recorded, which replays, and how the metrics will be compared."""
        if self.recorded_device is None:
            return f"replaying on {self.device} (the recording does not say its device)"
        if self.tolerance is None:
            return f"recorded on {self.recorded_device}, replaying on {self.device}: bit for bit"
        return (
            f"recorded on {self.recorded_device}, replaying on {self.device}: cross-device, "
            f"compared within a relative tolerance of {self.tolerance:g} (not bit for bit)"
        )

    @property
    def command_line(self) -> str:
        """For display only: a shell-quoted rendering of the argv."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(resolve(a) for a in self.argv)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps"] = list(self.steps)
        data["gpus"] = self.gpus or "cpu"
        data["device"] = self.device
        data["device_note"] = self.device_note
        return data


def plan_replay(
    index: DumpIndex,
    node: str,
    sample: dict[str, Any],
    template: LaunchTemplate,
    *,
    gpus: list[int] | None = None,
    first: int | None = None,
    last: int | None = None,
    script: str = "",
    python: str = "python3",
    config: str = "",
    overrides: list[str] | None = None,
) -> ReplayPlan:
    """Check the request against the dump and the node, and build the launch plan."""
    overrides = list(overrides or [])
    check_overrides(overrides, template)
    if takes_steps(template):
        first, last = choose_steps(index, first, last)
    else:
        chosen = (first, last)
        first, last = areal_steps(index)
        if chosen != (None, None) and chosen != (first, last):
            raise UserError(
                f"the {template.name} template cannot choose steps: AReaL's replay has no "
                f"start-step option and trains from global step 0; it will replay steps "
                f"{first}-{last} (leave the step range empty)"
            )
        total = config_key("total_train_steps")
        if not any(o.partition("=")[0].strip() == total for o in overrides):
            overrides.append(f"{total}={last + 1}")  # stop after the last dumped step
    if gpus is None:
        size = check_dp_size(index, first, last, 0)
        free = free_gpus(sample)
        gpus = free[:size] if len(free) >= size else []
    else:
        check_gpus(gpus, sample, node)
    size = check_dp_size(index, first, last, len(gpus), exact=template.name == "reference")
    if template.name == "areal" and not config:
        raise UserError("the areal template needs the experiment's --config file")
    if "{script}" in " ".join(template.argv) and not script:
        raise UserError(f"the {template.name} template needs a --script")
    values = {
        "python": python,
        "script": script,
        "config": config,
        "dir": index.path,
        "nproc": str(size),
        "start": str(first),
        "end": str(last),
        "stop": str(last + 1),
    }
    # Overrides are values too: their braces are literal.
    argv = [substitute(t, values) for t in template.argv] + [
        escape_placeholders(o) for o in overrides
    ]
    env = {"CUDA_VISIBLE_DEVICES": format_gpus(gpus) if gpus else ""}
    recorded = index.meta.get("device")
    recorded_device = str(recorded) if recorded in ("cuda", "cpu") else None
    cross = recorded_device is not None and recorded_device != ("cuda" if gpus else "cpu")
    return ReplayPlan(
        node=node,
        gpus=list(gpus),
        steps=(first, last),
        argv=argv,
        env=env,
        dump_dir=index.path,
        template=template.name,
        nproc=size,
        metrics=substitute(template.metrics, values) if template.metrics else None,
        recorded_metrics=(
            substitute(template.recorded_metrics, values) if template.recorded_metrics else None
        ),
        recorded_device=recorded_device,
        tolerance=CROSS_DEVICE_RTOL if cross else None,
    )


# --------------------------------------------------------------------------------------
# Verification


# CPU and CUDA kernels (and two GPU models) sum in different orders: float32 metrics of
# the same step then differ in the last few digits (0.99213773554 vs 0.99213769219 is a
# relative 4e-8), and the difference grows over steps. 1e-3 passes that and still catches a
# replay that went wrong (another batch, another loss).
CROSS_DEVICE_RTOL = 1e-3


@dataclass
class Verification:
    """Replay metrics against the recording, step by step."""

    matched: bool
    steps: list[int]
    first_mismatch: dict[str, Any] | None = None
    tolerance: float | None = None  # relative; None: bit for bit
    comparable: bool = True  # False: nothing to compare (the recording's metrics are gone)
    # The summary as a saved job record wrote it (an older console may have worded it
    # otherwise); None: worded from the fields.
    saved_summary: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_json(cls, raw: Any) -> Verification | None:
        """A saved verification (a job record's JSON); odd fields read as nothing found."""
        if not isinstance(raw, Mapping):
            return None
        steps = raw.get("steps")
        mismatch = raw.get("first_mismatch")
        tolerance = raw.get("tolerance")
        summary = raw.get("summary")
        return cls(
            matched=raw.get("matched") is True,
            steps=[s for s in steps if isinstance(s, int)] if isinstance(steps, list) else [],
            first_mismatch=dict(mismatch) if isinstance(mismatch, Mapping) else None,
            tolerance=(
                float(tolerance)
                if isinstance(tolerance, int | float) and not isinstance(tolerance, bool)
                else None
            ),
            comparable=raw.get("comparable") is not False,
            saved_summary=summary if isinstance(summary, str) else None,
        )

    @property
    def verdict(self) -> str:
        """The verification in a few words (a table cell)."""
        if not self.comparable:
            return "cannot compare"
        if self.matched:
            return "matches recording" + (" (within tol.)" if self.tolerance else "")
        m = self.first_mismatch or {}
        metric = m.get("metric")
        return f"differs at step {m.get('step')}" + (f": {metric}" if metric else "")

    @property
    def summary(self) -> str:
        if self.saved_summary is not None:
            return self.saved_summary
        m = self.first_mismatch or {}
        if not self.comparable:
            return f"cannot compare with the recording: {m.get('reason')}"
        how = (
            "bit for bit"
            if self.tolerance is None
            else f"within relative tolerance {self.tolerance:g}, cross-device"
        )
        if self.matched:
            return f"replay matches recording (steps {format_steps(self.steps)}, {how})"
        if m.get("metric") is None:
            return f"replay differs from recording at step {m.get('step')}: {m.get('reason')}"
        return (
            f"replay differs from recording at step {m.get('step')}: {m['metric']} "
            f"recorded {m.get('recorded')!r}, replayed {m.get('replayed')!r} ({how})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "matched": self.matched,
            "comparable": self.comparable,
            "tolerance": self.tolerance,
            "steps": self.steps,
            "first_mismatch": self.first_mismatch,
            "summary": self.summary,
        }


def parse_metrics(text: str) -> dict[int, dict[str, Any]]:
    """Metrics JSONL -> step -> record (a torn last line is skipped)."""
    out: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out[record["step"]] = record
    return out


def _same(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two JSON values (NaN equals NaN: both runs produced it)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _close(a: Any, b: Any, rel_tol: float) -> bool:
    """Equal within `rel_tol` for numbers (NaN equals NaN), exactly equal otherwise."""
    if _same(a, b):
        return True
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-12)
    return False


def verify(
    recorded: dict[int, dict[str, Any]],
    replayed: dict[int, dict[str, Any]],
    steps: tuple[int, int],
    metrics: tuple[str, ...] = METRIC_NAMES,
    rel_tol: float | None = None,
) -> Verification:
    """Every metric of every replayed step, in step order: exactly, or within `rel_tol`
    (a replay on another device than the recording)."""
    first, last = steps
    checked: list[int] = []
    for step in range(first, last + 1):
        rec, rep = recorded.get(step), replayed.get(step)
        if rec is None or rep is None:
            where = "recording" if rec is None else "replay"
            return Verification(
                False,
                checked,
                {
                    "step": step,
                    "metric": None,
                    "recorded": None,
                    "replayed": None,
                    "reason": f"step {step} is missing from the {where} metrics",
                },
                tolerance=rel_tol,
                comparable=rec is not None,  # nothing recorded for it: nothing to compare
            )
        for name in metrics:
            a, b = rec.get(name), rep.get(name)
            if not (_same(a, b) if rel_tol is None else _close(a, b, rel_tol)):
                return Verification(
                    False,
                    checked,
                    {"step": step, "metric": name, "recorded": a, "replayed": b},
                    tolerance=rel_tol,
                )
        checked.append(step)
    return Verification(True, checked, tolerance=rel_tol)
