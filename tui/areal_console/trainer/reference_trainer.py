"""A small but real RL trainer with AReaL's trajectory dump/replay flags.

Standard library and torch only: this file is shipped to cluster nodes and run there as a
plain script:

    python3 reference_trainer.py [--nproc N] [--config FILE] [--default-output-dir DIR] [key=value ...]

`output_dir` (the per-step metrics) defaults to `--default-output-dir`, else
`./reference-trainer-out`; `areal-console trainer` passes a folder in its data dir.

A tiny causal language model (built in code, no downloads) learns single-digit addition
("a+b=" -> digits, EOS) from a rule-based reward. Each step it samples a group of
completions per prompt with a one-version-stale policy (as an asynchronous rollout
engine would), computes GRPO group-normalised advantages and optimises AReaL's decoupled
PPO objective

    L = -E[ (pi_prox / pi_behave) * min(r * A, clip(r, 1 - eps, 1 + eps) * A) ],
    r = pi_theta / pi_prox,

with AReaL's `actor.rejection_sampling` (token level, ratio metric): tokens whose
pi_prox / pi_behave exceeds `upper` are masked out (`action: mask`) or the weight clamped
to it (`action: clamp`); `actor.rejection_sampling=null` turns the filter and the
behaviour weighting off, as in AReaL (areal/utils/functional/functional.py:500-575).
Ranks are data parallel (gloo on CPU, NCCL on GPUs; torchrun when N > 1).

With `trajectory_debug.dump_rollout_data=true` every chosen step's rollout batch is saved
in AReaL's layout (`step_{step:06d}.pt`, or `step_{step:06d}_dp_{rank}.pt` with several
ranks: a list with one dict of right-padded [G, T] tensors per prompt group), together
with a checkpoint taken just before that step and the per-step metrics. With
`trajectory_debug.replay_rollout_data=true` the recorded batches feed the same training
steps instead of sampling; on CPU the metrics then match the recording bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

# A node's python may lack numpy; torch then warns "Failed to initialize NumPy" on import,
# into every replay log. Nothing here uses numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

TRAINER_NAME = "areal-console reference trainer"
TRAINER_VERSION = 1

# Metric names as AReaL's trainer logs them; replay verification compares these.
METRIC_NAMES = (
    "task_reward",
    "seq_len",
    "no_eos_ratio",
    "importance_weight",
    "behave_imp_weight",
    "actor_loss",
    "grad_norm",
)

METRICS_FILE = "metrics.jsonl"
META_FILE = "trajectory_meta.json"
CHECKPOINT_DIR = "checkpoints"
# The agent's DUMP_FILE (areal_node/agent.py), copied: this script runs on a node on its
# own and imports nothing of the console; tests/test_replay_core.py holds the two equal.
DUMP_NAME = re.compile(r"^step_(\d{6,})(?:_dp_(\d+))?\.pt$")

# Keys the rollout writes; everything else in a dump was added by the trainer.
ROLLOUT_KEYS = (
    "input_ids",
    "loss_mask",
    "logprobs",
    "versions",
    "turn_ids",
    "attention_mask",
    "rewards",
)

# Vocabulary: digits 0-9, then the symbols.
PLUS, EQUALS, EOS, BOS = 10, 11, 12, 13
VOCAB_SIZE = 14
PROMPT_LEN = 5  # BOS a + b =

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


# --------------------------------------------------------------------------------------
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
    dotted: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {item!r}")
        set_dotted(dotted, key.strip(), parse_scalar(value))
    layers.append(dotted)
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


# --------------------------------------------------------------------------------------
# Dump directory layout


def dump_path(directory: str, step: int, dp_rank: int | None) -> str:
    suffix = f"_dp_{dp_rank}" if dp_rank is not None else ""
    return os.path.join(directory, f"step_{step:06d}{suffix}.pt")


def checkpoint_path(directory: str, step: int) -> str:
    return os.path.join(directory, CHECKPOINT_DIR, f"ckpt_{step:06d}.pt")


def scan_dumps(directory: str) -> dict[int, set[int | None]]:
    """step -> the dp ranks present (None for a file without a `_dp_` suffix)."""
    found: dict[int, set[int | None]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        m = DUMP_NAME.match(name)
        if m:
            found.setdefault(int(m.group(1)), set()).add(
                int(m.group(2)) if m.group(2) is not None else None
            )
    return found


def scan_checkpoints(directory: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(directory, CHECKPOINT_DIR))
    except OSError:
        return []
    return sorted(int(n[5:-3]) for n in names if re.fullmatch(r"ckpt_\d+\.pt", n))


def format_steps(steps: list[int]) -> str:
    """Compact ranges: [1, 2, 3, 5] -> "1-3,5"."""
    runs: list[list[int]] = []
    for s in sorted(set(steps)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def read_meta(directory: str) -> dict[str, Any]:
    try:
        with open(os.path.join(directory, META_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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


def rotate_dumps(directory: str, dp_rank: int | None, max_keep: int, pin: set[int]) -> None:
    """Keep the newest `max_keep` unpinned dumps of this rank (AReaL's rotation rule)."""
    mine = sorted(
        step
        for step, ranks in scan_dumps(directory).items()
        if dp_rank in ranks and step not in pin
    )
    for step in mine[: max(0, len(mine) - max_keep)]:
        doomed = [dump_path(directory, step, dp_rank)]
        if dp_rank in (None, 0):
            doomed.append(checkpoint_path(directory, step))  # rank 0 owns checkpoints
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):  # another rank rotated it first
                os.remove(path)


def atomic_save(obj: Any, path: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# The model


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        # Plain math attention: the same kernels with and without grad, on every device.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        att = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(att)
        return x + self.mlp(self.ln2(x))


class TinyCausalLM(nn.Module):
    def __init__(self, d_model: int, n_layers: int, n_heads: int, max_len: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB_SIZE, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB_SIZE)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    def token_logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        """log p(ids[:, t] | ids[:, :t]) at position t (0 at position 0)."""
        logp = self.forward(ids[:, :-1]).log_softmax(-1)
        picked = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return F.pad(picked, (1, 0))


class Adam:
    """Plain Adam, the textbook update rule.

    torch.optim imports torch's compiler stack on first use (seconds per process start);
    this one does not, and its state dict loads with `weights_only=True`.
    """

    def __init__(
        self,
        params: list[nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):  # noqa: B905
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / (1 - b2**self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1**self.t))

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        saved = list(state["exp_avg"]) + list(state["exp_avg_sq"])
        for k, mine in enumerate(self.exp_avg + self.exp_avg_sq):
            mine.copy_(saved[k])


# --------------------------------------------------------------------------------------
# Rollouts: sampling and a rule-based reward


def answer_reward(prompt: list[int], completion: list[int]) -> float:
    """1.0 when the digits before EOS spell a + b; 0.25 for a well-formed wrong number; else 0."""
    a, b = prompt[1], prompt[3]
    if EOS not in completion:
        return 0.0
    digits = completion[: completion.index(EOS)]
    if not digits or any(d > 9 for d in digits):
        return 0.0
    return 1.0 if int("".join(map(str, digits))) == a + b else 0.25


@torch.no_grad()
def generate_groups(
    model: TinyCausalLM,
    config: dict[str, Any],
    step: int,
    rank: int,
    version: int,
    device: torch.device,
) -> list[dict[str, torch.Tensor]]:
    """Sample `n_samples` completions for each prompt; one AReaL-layout dict per group."""
    g = torch.Generator().manual_seed(config["seed"] * 1_000_003 + step * 1009 + rank)
    n_prompts = config["train_dataset"]["batch_size"]
    group = config["gconfig"]["n_samples"]
    max_new = config["gconfig"]["max_new_tokens"]
    temperature = float(config["gconfig"]["temperature"])
    operands = torch.randint(0, 10, (n_prompts, 2), generator=g)
    prompts = [[BOS, int(a), PLUS, int(b), EQUALS] for a, b in operands.tolist()]
    ids = torch.tensor([p for p in prompts for _ in range(group)], dtype=torch.long)
    logps = torch.zeros(ids.shape[0], 0)
    for _ in range(max_new):
        logits = model(ids.to(device))[:, -1].float().cpu() / temperature
        logp = logits.log_softmax(-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=g)
        ids = torch.cat([ids, nxt], dim=1)
        logps = torch.cat([logps, logp.gather(-1, nxt)], dim=1)
    groups = []
    for p_idx, prompt in enumerate(prompts):
        rows = range(p_idx * group, (p_idx + 1) * group)
        completions, lengths, rewards = [], [], []
        for r in rows:
            gen = ids[r, PROMPT_LEN:].tolist()
            # Everything after the first EOS was never generated by a real engine.
            n = gen.index(EOS) + 1 if EOS in gen else len(gen)
            completions.append(gen[:n])
            lengths.append(PROMPT_LEN + n)
            rewards.append(answer_reward(prompt, gen[:n]))
        t = max(lengths)
        batch = {
            "input_ids": torch.zeros(group, t, dtype=torch.int32),
            "loss_mask": torch.zeros(group, t, dtype=torch.int32),
            "logprobs": torch.zeros(group, t, dtype=torch.float32),
            "versions": torch.full((group, t), -1, dtype=torch.int32),
            "turn_ids": torch.zeros(group, t, dtype=torch.int32),
            "attention_mask": torch.zeros(group, t, dtype=torch.bool),
            "rewards": torch.tensor(rewards, dtype=torch.float32),
        }
        for i, r in enumerate(rows):
            n = lengths[i]
            batch["input_ids"][i, :n] = torch.tensor(prompt + completions[i], dtype=torch.int32)
            batch["loss_mask"][i, PROMPT_LEN:n] = 1
            batch["logprobs"][i, PROMPT_LEN:n] = logps[r, : n - PROMPT_LEN]
            batch["versions"][i, PROMPT_LEN:n] = version
            batch["attention_mask"][i, :n] = True
        groups.append(batch)
    return groups


# --------------------------------------------------------------------------------------
# One training step on a batch (identical code for live and replayed batches)


def all_reduce_sum(t: torch.Tensor, world_size: int) -> torch.Tensor:
    """Sum over ranks in place; NCCL only reduces GPU tensors, so CPU ones make a round trip."""
    if world_size > 1:
        if dist.get_backend() == "nccl" and t.device.type != "cuda":
            on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
            t.copy_(on_gpu.cpu())
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def stack_groups(groups: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate group dicts into one right-padded batch."""
    t = max(g["input_ids"].shape[1] for g in groups)
    out: dict[str, torch.Tensor] = {}
    for key in ("input_ids", "loss_mask", "logprobs", "attention_mask"):
        out[key] = torch.cat([F.pad(g[key], (0, t - g[key].shape[1])) for g in groups])
    out["rewards"] = torch.cat([g["rewards"] for g in groups])
    return out


def group_advantages(groups: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """GRPO: each sample's reward normalised by its group's mean and std."""
    out = []
    for g in groups:
        r = g["rewards"].float()
        out.append((r - r.mean()) / (r.std(unbiased=False) + 1e-6))
    return out


def train_step(
    model: TinyCausalLM,
    optimizer: Adam,
    groups: list[dict[str, torch.Tensor]],
    config: dict[str, Any],
    world_size: int,
    device: torch.device,
    trainer_view: list[dict[str, torch.Tensor]] | None = None,
) -> dict[str, float | None]:
    """Decoupled PPO on one rollout batch; returns the step's global metrics.

    `trainer_view`, when given, receives the groups with the proximal log-probabilities
    the trainer computed, stored as AReaL's `compute_logp` returns them: next-token aligned
    (position t scores token t+1), under the loss mask rolled by -1 the same way.
    """
    actor = config["actor"]
    eps = float(actor["eps_clip"])
    rs = actor["rejection_sampling"] if actor["use_decoupled_loss"] else None
    groups = [{k: g[k] for k in ROLLOUT_KEYS} for g in groups]  # ignore trainer-added keys
    advantages = group_advantages(groups)
    with torch.no_grad():
        prox = [model.token_logprobs(g["input_ids"].long().to(device)).cpu() for g in groups]
    if trainer_view is not None:
        for g, p in zip(groups, prox):  # noqa: B905 (nodes may run Python < 3.10)
            next_mask = torch.roll(g["loss_mask"], shifts=-1, dims=-1)
            trainer_view.append({**g, "prox_logp": torch.roll(p, shifts=-1, dims=-1) * next_mask})

    full = stack_groups(groups)
    lengths = full["attention_mask"].sum(-1)
    # AReaL's no_eos_ratios (areal/trainer/ppo/actor.py:419): length == the batch's padded
    # width, no EOS token involved.
    no_eos = (lengths == full["attention_mask"].shape[-1]).to(torch.float64)
    summary = all_reduce_sum(
        torch.tensor(
            [
                float(full["rewards"].sum()),
                float(lengths.sum()),
                float(no_eos.sum()),
                float(full["rewards"].numel()),
            ],
            dtype=torch.float64,
        ),
        world_size,
    )

    n_mb = max(1, min(int(actor["ppo_n_minibatches"]), len(groups)))
    bounds = [round(i * len(groups) / n_mb) for i in range(n_mb + 1)]
    loss_total, norm_total = 0.0, 0.0
    ratio_sum = torch.zeros((), dtype=torch.float64)
    behave_sum = torch.zeros((), dtype=torch.float64)
    tokens = torch.zeros((), dtype=torch.float64)
    behave_tokens = torch.zeros((), dtype=torch.float64)
    for i in range(n_mb):
        mb_groups = groups[bounds[i] : bounds[i + 1]]
        mb = stack_groups(mb_groups)
        width = mb["input_ids"].shape[1]
        adv = torch.cat(
            [
                F.pad(
                    a.unsqueeze(1).expand(-1, g["input_ids"].shape[1]),
                    (0, width - g["input_ids"].shape[1]),
                )
                for a, g in zip(advantages[bounds[i] : bounds[i + 1]], mb_groups)  # noqa: B905
            ]
        )
        prox_mb = torch.cat(
            [F.pad(p, (0, width - p.shape[1])) for p in prox[bounds[i] : bounds[i + 1]]]
        )
        stat_mask = mb["loss_mask"].float()
        mask = stat_mask
        behave_w = torch.exp(prox_mb - mb["logprobs"]) * stat_mask
        anchor = prox_mb if actor["use_decoupled_loss"] else mb["logprobs"]
        # AReaL keeps the denominator at the tokens before filtering (functional.py:500-504).
        n_tokens = all_reduce_sum(stat_mask.sum().to(torch.float64), world_size).item()
        if rs is not None:
            # functional.py:262-431 for level=token, metric=ratio: mask drops the tokens
            # above `upper`, clamp bounds their weight; the weight then scales the loss.
            upper = float(rs["upper"])
            if rs["action"] == "mask":
                mask = stat_mask * (behave_w <= upper).float()
            else:
                behave_w = behave_w.clamp(max=upper)
            behave_w = behave_w * mask

        optimizer.zero_grad(set_to_none=True)
        logp = model.token_logprobs(mb["input_ids"].long().to(device)).cpu()
        ratio = torch.exp(logp - anchor) * stat_mask
        clipped = ratio.clamp(1.0 - eps, 1.0 + eps)
        pg = -torch.min(ratio * adv, clipped * adv)
        if rs is not None:
            pg = pg * behave_w.detach()
        loss = (pg * mask).sum() / max(n_tokens, 1.0)
        loss.backward()
        if world_size > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        norm = torch.nn.utils.clip_grad_norm_(
            model.parameters(), float(actor["optimizer"]["gradient_clipping"])
        )
        optimizer.step()

        loss_total += all_reduce_sum(loss.detach().to(torch.float64), world_size).item()
        norm_total += float(norm)
        # AReaL's stats (actor.py:675-695): importance_weight (pi_theta/pi_prox) over the
        # loss-mask tokens; behave_imp_weight over the tokens the filter kept.
        kept = (behave_w > 0) & mask.bool()
        ratio_sum += (ratio.detach() * stat_mask).sum().to(torch.float64)
        tokens += stat_mask.sum().to(torch.float64)
        behave_sum += (behave_w * kept).sum().to(torch.float64)
        behave_tokens += kept.sum().to(torch.float64)

    weights = all_reduce_sum(
        torch.stack([ratio_sum, behave_sum, tokens, behave_tokens]), world_size
    )
    n_tok = max(float(weights[2]), 1.0)
    n_samples = float(summary[3])
    return {
        "task_reward": float(summary[0]) / n_samples,
        "seq_len": float(summary[1]) / n_samples,
        "no_eos_ratio": float(summary[2]) / n_samples,
        "importance_weight": float(weights[0]) / n_tok,
        # Logged only with rejection sampling, as AReaL does (null otherwise).
        "behave_imp_weight": (
            float(weights[1]) / max(float(weights[3]), 1.0) if rs is not None else None
        ),
        "actor_loss": loss_total / n_mb,
        "grad_norm": norm_total / n_mb,
    }


# --------------------------------------------------------------------------------------
# The run


# --------------------------------------------------------------------------------------
# AReaL's stats log: what its StatsLogger prints per step (areal/utils/stats_logger.py:135-162
# at cbff54d6), so the console's Health view reads this trainer like an AReaL run. Written
# without tabulate/colorlog (this file runs on nodes with torch only); the console's tests
# check it against the real packages.

# Our metrics under the names AReaL's actor, engine and workflow log them.
AREAL_NAMES = {
    "task_reward": "ppo_actor/task_reward/avg",
    "seq_len": "ppo_actor/seq_len/avg",
    "no_eos_ratio": "ppo_actor/no_eos_ratios/avg",
    "importance_weight": "ppo_actor/update/importance_weight/avg",
    "behave_imp_weight": "ppo_actor/update/behave_imp_weight/avg",
    "actor_loss": "ppo_actor/update/actor_loss/avg",
    "grad_norm": "ppo_actor/update/grad_norm",
}
# areal/utils/logging.py:15-22 (header and format), :38-60 (StatsLogger is light_green)
AREAL_HEADER = "\033[1;38;2;180;140;80m(AReaL)\033[0m"
LIGHT_GREEN, RESET = "\033[92m", "\033[0m"


def areal_stats(metrics: dict[str, float | None], time_s: float) -> dict[str, float]:
    # A stat with no value (no tokens left to average) is left out, as AReaL's stats
    # tracker drops None results (areal/utils/stats_tracker.py:402-404).
    stats = {
        AREAL_NAMES[k]: float(v) for k, v in metrics.items() if k in AREAL_NAMES and v is not None
    }
    reward = metrics.get("task_reward")
    if reward is not None:
        stats["rollout/reward"] = float(reward)  # no filtering here: every sample counts
    stats["timeperf/train_step"] = float(time_s)
    return stats


def _decimals(text: str) -> int:
    """Digits after the point of a formatted number (-1 for nan/inf), as tabulate counts."""
    pos = text.rfind(".")
    return len(text) - pos - 1 if pos >= 0 else -1


def stats_table(stats: dict[str, float], col: int = 4) -> str:
    """areal/utils/printing.py:6-21: four key/value pairs a row, column-major, `.4e`, in
    tabulate's `fancy_grid` (keys left-aligned, values aligned on the decimal point)."""
    items = list(stats.items())
    rows = (len(items) + col - 1) // col
    columns: list[list[str]] = []
    for j in range(col):
        chunk = items[j * rows : (j + 1) * rows]
        if not chunk:
            break
        keys = [k for k, _ in chunk] + [""] * (rows - len(chunk))
        values = [format(v, ".4e") for _, v in chunk]
        most = max(_decimals(v) for v in values)
        values = [v + " " * (most - _decimals(v)) for v in values]
        width = max(len(v) for v in values)
        columns.append([k.ljust(max(len(k) for k in keys)) for k in keys])
        columns.append([v.rjust(width) for v in values] + [" " * width] * (rows - len(chunk)))
    widths = [len(c[0]) for c in columns]

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    lines = [rule("╒", "═", "╤", "╕")]
    for i in range(rows):
        if i:
            lines.append(rule("├", "─", "┼", "┤"))
        lines.append("│ " + " │ ".join(c[i] for c in columns) + " │")
    lines.append(rule("╘", "═", "╧", "╛"))
    return "\n".join(lines)


def areal_log_line(message: str, when: float) -> str:
    """One StatsLogger record as rank 0's stdout carries it (AReaL's areal/utils/logging.py:
    218-229, the `plain` format "%(log_color)s" + LOG_FORMAT, in StatsLogger's light_green,
    :60; reset appended)."""
    stamp = time.strftime("%Y%m%d-%H:%M:%S", time.localtime(when))
    millis = int((when - int(when)) * 1000)
    return (f"{LIGHT_GREEN}{AREAL_HEADER} {LIGHT_GREEN}{stamp}.{millis:03d} StatsLogger INFO: "
            f"{message}{RESET}")  # fmt: skip


def log_areal_step(step: int, last: int, stats: dict[str, float], writer: Any) -> None:
    """The progress line, `Stats (1/1):` and the table; tensorboard at global step `step - 1`."""
    now = time.time()
    print(areal_log_line(f"Epoch 1/1 Step {step}/{last} Train step {step}/{last} done.", now))
    print(areal_log_line("Stats (1/1):", now))
    print(areal_log_line("\n" + stats_table(stats), now), flush=True)
    if writer is not None:
        for key, value in stats.items():
            writer.add_scalar(key, value, step - 1)
        writer.flush()


def tensorboard_writer(path: str | None) -> Any:
    """torch's SummaryWriter (the same event files as AReaL's tensorboardX); None without
    the `tensorboard` package."""
    if not path:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("note: the tensorboard package is not installed here; not writing events")
        return None
    return SummaryWriter(log_dir=path)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def write_jsonl(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def run(config: dict[str, Any], default_output_dir: str = "reference-trainer-out") -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(config["threads"])
    if torch.cuda.is_available():
        # On CPU every op used here is deterministic already; this switch also imports
        # torch's compiler stack (seconds), so it is only worth it on GPUs.
        torch.use_deterministic_algorithms(True, warn_only=True)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    hang = config["debug"]["hang"]
    if world_size > 1 and backend == "gloo" and config["debug"]["flight_recorder"]:
        enable_flight_recorder()
    if world_size > 1:
        # A hung demo job should stay hung while someone looks at it, not time out.
        timeout = timedelta(hours=6) if hang != "none" else timedelta(minutes=30)
        dist.init_process_group(backend, timeout=timeout)

    td = config["trajectory_debug"]
    dump_dir = str(td["path"])
    dumping, replaying = bool(td["dump_rollout_data"]), bool(td["replay_rollout_data"])
    out_dir = config["output_dir"] or (
        os.path.join(dump_dir, "replay") if replaying else default_output_dir
    )
    dp_suffix = rank if world_size > 1 else None
    if rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        open(os.path.join(out_dir, METRICS_FILE), "w").close()
        print(f"metrics: {os.path.abspath(os.path.join(out_dir, METRICS_FILE))}", flush=True)
        if dumping:
            os.makedirs(os.path.join(dump_dir, CHECKPOINT_DIR), exist_ok=True)
            open(os.path.join(dump_dir, METRICS_FILE), "w").close()
            # Like a model directory: tells readers (the batch browser) the EOS token id.
            with open(os.path.join(dump_dir, "generation_config.json"), "w") as fh:
                json.dump({"eos_token_id": EOS, "bos_token_id": BOS}, fh)
            with open(os.path.join(dump_dir, META_FILE), "w", encoding="utf-8") as fh:
                json.dump(
                    {
                        "trainer": TRAINER_NAME,
                        "trainer_version": TRAINER_VERSION,
                        "world_size": world_size,
                        # What a replay on another device compares against (CUDA and CPU
                        # kernels round differently: not bit for bit across devices).
                        "device": device.type,
                        "device_name": (
                            torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
                        ),
                        "config": config,
                        "metric_names": list(METRIC_NAMES),
                    },
                    fh,
                    indent=1,
                )
    if world_size > 1:
        dist.barrier()

    torch.manual_seed(config["seed"])
    m = config["model"]
    model = TinyCausalLM(m["d_model"], m["n_layers"], m["n_heads"]).to(device)
    optimizer = Adam(list(model.parameters()), lr=float(config["actor"]["optimizer"]["lr"]))
    first, last = config["start_step"], config["steps"] - 1
    if replaying and first > 0:
        state = torch.load(checkpoint_path(dump_dir, first), map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    lag = int(config["rollout"]["max_head_offpolicyness"])
    run_t0 = time.perf_counter()
    tb_writer = (
        tensorboard_writer(config["stats_logger"]["tensorboard"]["path"]) if rank == 0 else None
    )
    history: list[dict[str, torch.Tensor]] = []  # recent weights, for a stale rollout policy
    rollout_model = copy.deepcopy(model)

    for step in range(first, last + 1):
        t0 = time.perf_counter()
        version = step  # optimizer updates applied so far (AReaL's global_step)
        if replaying:
            groups = torch.load(dump_path(dump_dir, step, dp_suffix), weights_only=True)
        else:
            history.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            del history[: max(0, len(history) - lag - 1)]
            rollout_model.load_state_dict(history[0])
            behaviour_version = max(0, version - lag)
            groups = generate_groups(rollout_model, config, step, rank, behaviour_version, device)
        dump_now = dumping and (td["dump_steps"] is None or step in td["dump_steps"])
        if dump_now:
            if rank == 0 and td["save_checkpoints"]:
                atomic_save(
                    {
                        "step": step,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    },
                    checkpoint_path(dump_dir, step),
                )
            if td["dump_scope"] == "rollout":
                atomic_save(groups, dump_path(dump_dir, step, dp_suffix))
        full_view: list[dict[str, torch.Tensor]] = []
        metrics = train_step(model, optimizer, groups, config, world_size, device, full_view)
        if dump_now and td["dump_scope"] == "full":
            atomic_save(full_view, dump_path(dump_dir, step, dp_suffix))
        if dump_now and td["max_keep"] is not None:
            rotate_dumps(dump_dir, dp_suffix, int(td["max_keep"]), set(td["pin_steps"]))
        if rank == 0:
            elapsed = round(time.perf_counter() - t0, 6)
            record = {"step": step, **metrics, "time_s": elapsed}
            write_jsonl(os.path.join(out_dir, METRICS_FILE), record)
            if dumping:
                write_jsonl(os.path.join(dump_dir, METRICS_FILE), record)
            print(
                f"step {step}: "
                + " ".join(f"{k}={_g(metrics[k])}" for k in METRIC_NAMES)
                + (" (replayed)" if replaying else ""),
                flush=True,
            )
            # AReaL's log is 1-based: "Train step N/T" is global step N-1 (stats_logger.py:
            # 138-141); T is total_train_steps, here `steps`.
            log_areal_step(step + 1, config["steps"], areal_stats(metrics, elapsed), tb_writer)
    if tb_writer is not None:
        tb_writer.close()
    if rank == 0 and hang == "none":
        # stats_logger.py:125 (StatsLogger.close); a run that hangs never gets here.
        print(
            areal_log_line(
                f"Training completes! Total time elapsed {time.perf_counter() - run_t0:.2f}.",
                time.time(),
            ),
            flush=True,
        )
    if world_size > 1 and hang != "none":
        hang_like_a_broken_job(hang, rank, world_size, device)
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# Hangs on purpose (debug.hang), shaped like AReaL's debugging guide's patterns


def hang_like_a_broken_job(pattern: str, rank: int, world_size: int, device: torch.device) -> None:
    """Block forever the way a broken job does, after the recorded steps are safe on disk."""
    ranks = list(range(world_size))
    # Every rank creates the same groups (new_group is collective), then the ranks diverge.
    side_group = dist.new_group(ranks)
    rings = [dist.new_group(sorted({i, (i + 1) % world_size})) for i in ranks]
    grads = torch.zeros(8, device=device)
    print(f"rank {rank}: hanging on purpose (debug.hang={pattern})", flush=True)
    if pattern == "cleanup":
        if rank == world_size - 1:
            try:
                raise FloatingPointError(f"rank {rank}: loss is NaN")
            finally:
                cleanup_distributed(side_group)  # waits for ranks that are still training
        all_reduce_gradients(grads, None)
    elif pattern == "mismatch":
        if rank % 2 == 1:
            broadcast_parameters(grads, side_group)  # the others are in all_reduce: no match
        else:
            all_reduce_gradients(grads, None)
    elif pattern == "collective":
        # Each rank waits in the same all_reduce, on its own pair of a ring: none completes.
        all_reduce_gradients(grads, rings[rank])


def all_reduce_gradients(grads: torch.Tensor, group: Any) -> None:
    dist.all_reduce(grads, group=group)


def broadcast_parameters(params: torch.Tensor, group: Any) -> None:
    dist.broadcast(params, src=0, group=group)


def cleanup_distributed(group: Any) -> None:
    dist.barrier(group=group)
    dist.destroy_process_group()


_FR_SERVER: Any = None


def enable_flight_recorder() -> None:
    """Turn on torch's Flight Recorder (every collective: group, sequence id, op, sizes)
    and serve it from a C++ thread on `$TMPDIR/areal-fr-<pid>.sock`, where the console's
    agent asks for it even while this rank is blocked in a collective. It only records
    (2,000 entries, a few hundred KB); results are unchanged."""
    global _FR_SERVER
    hook = sys.modules.get("sitecustomize")
    if getattr(hook, "HANDLER", None) == "areal_fr_trace":
        return  # the console's launch hook runs in this process: it serves the record
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # read when the group starts
    try:
        from torch._C._distributed_c10d import _WorkerServer
    except ImportError:  # a torch without it: the console shows stacks only
        return
    name = f"areal-fr-{os.getpid()}.sock"
    # Where the agent looks, in order; a Unix socket path must stay short.
    dirs = (os.environ.get("AREAL_FR_SOCKET_DIR"), os.environ.get("TMPDIR"), "/tmp")
    path = next(os.path.join(d, name) for d in dirs if d and len(os.path.join(d, name)) < 100)
    with contextlib.suppress(OSError):
        os.unlink(path)  # left by an earlier process with this pid
    _FR_SERVER = _WorkerServer(path)


# The console's Flight Recorder launch hook, when this file runs from the console's package:
# on the ranks' PYTHONPATH it also records each process group's members.
FR_HOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fr_hook")


def relaunch_with_torchrun(nproc: int, argv: list[str], fr_hook: bool = False) -> int:
    """Run this script under torchrun with `nproc` ranks on this node."""
    import subprocess

    env = dict(os.environ)
    if fr_hook and os.path.isfile(os.path.join(FR_HOOK_DIR, "sitecustomize.py")):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [FR_HOOK_DIR, env.get("PYTHONPATH")]))

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        os.path.abspath(__file__),
        *argv,
    ]
    return subprocess.call(cmd, env=env)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    nproc, config_file, overrides = 1, None, []
    default_output_dir = "reference-trainer-out"  # when output_dir is not set
    passed_on: list[str] = []  # everything but --nproc, for the torchrun relaunch
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            print(__doc__)
            print("config keys and defaults:")
            for key, value in flatten(DEFAULTS).items():
                print(f"  {key}={json.dumps(value)}")
            return 0
        if arg in ("--nproc", "--config", "--default-output-dir") and i + 1 < len(args):
            if arg == "--default-output-dir":
                default_output_dir = args[i + 1]
                passed_on += args[i : i + 2]
            elif arg == "--nproc":
                try:
                    nproc = int(args[i + 1])
                except ValueError:
                    print(f"error: --nproc needs an integer, got {args[i + 1]!r}", file=sys.stderr)
                    return 2
            else:
                config_file = args[i + 1]
                passed_on += args[i : i + 2]
            i += 2
            continue
        if arg.startswith("-"):
            print(f"error: unknown option {arg}", file=sys.stderr)
            return 2
        overrides.append(arg)
        passed_on.append(arg)
        i += 1
    under_torchrun = "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        config = load_config(config_file, overrides)
        world = int(os.environ["WORLD_SIZE"]) if under_torchrun else nproc
        td = config["trajectory_debug"]
        if td["replay_rollout_data"]:
            check_replay_input(str(td["path"]), config["start_step"], config["steps"] - 1, world)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if nproc > 1 and not under_torchrun:
        on_cpu = not torch.cuda.is_available()
        fr_hook = on_cpu and config["debug"]["flight_recorder"]
        return relaunch_with_torchrun(nproc, passed_on, fr_hook=fr_hook)
    run(config, default_output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
