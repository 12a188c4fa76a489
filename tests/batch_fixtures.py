"""Rollout dumps as AReaL writes them, saved with `torch.save`, for tests, demos and benches.

Each sample is the episode dict AReaL's RLVR workflow returns (tests/areal_code.py:
`rlvr_episode`, areal/workflow/rlvr.py:163-180) and a group is those episodes put together
by AReaL's `concat_padded_tensors` (areal/utils/data.py:241-298, called by
GroupedRolloutWorkflow, areal/infra/remote_inf_engine.py:162). Layouts:

- trajectory dumps (`trajectory_debug.dump_rollout_data`, AReaL PR #1407): a flat directory of
  `step_{step:06d}.pt` (or `step_{step:06d}_dp_{k}.pt` in SPMD mode), each a
  `list[dict[str, Tensor]]` with one dict per prompt group, every tensor right-padded to
  `[G, T_group]` (the group's longest sequence) and `rewards` of shape `[G]`;
- a single dict-of-tensors batch (what one saves with `torch.save(batch, ...)` while debugging);
- text rollout dumps (`rollout.dump_to_file`): `rollout/<version>/<task_id>.jsonl`;
- a model state_dict, which the browser must name as a checkpoint rather than a batch.

Token values are random but seeded, so a fixture is the same bytes every time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from tests import areal_code as ac

PAD_TOKEN_ID = 0
EOS_TOKEN_ID = 2
VOCAB_SIZE = 32000


def make_group(
    gen: torch.Generator,
    *,
    group_size: int,
    prompt_len: int,
    max_new_tokens: int,
    version: int,
    eos_token_id: int = EOS_TOKEN_ID,
    no_eos_fraction: float = 0.1,
    equal_rewards: bool = False,
    max_staleness: int = 2,
    with_prox_logp: bool = False,
    prox_drift: float = 0.05,
    multi_turn: bool = False,
    vocab_size: int = VOCAB_SIZE,
) -> dict[str, torch.Tensor]:
    """One GRPO group: `group_size` completions of one shared prompt, as AReaL pads them.

    A completion that hits the limit has `max_new_tokens` tokens and no EOS. With
    `with_prox_logp`, the group carries `prox_logp` as the trainer adds it: next-token
    aligned (`compute_logp`), the behaviour log-probability of the next token plus a
    Gaussian drift of `prox_drift` (0 means the proximal policy is the behaviour one).
    """
    prompt = torch.randint(3, vocab_size, (prompt_len,), generator=gen, dtype=torch.int32)
    if equal_rewards:
        same = float(torch.randint(0, 2, (), generator=gen).item())
        rewards = [same] * group_size
    else:
        rewards = (torch.rand(group_size, generator=gen) < 0.5).float().tolist()
        rewards[0], rewards[-1] = 1.0, 0.0  # a mixed group by construction
    episodes = []
    for i in range(group_size):
        hit_limit = torch.rand((), generator=gen).item() < no_eos_fraction
        if hit_limit:
            n = max_new_tokens
        else:
            # Lengths spread over the budget, most well below it (a log-normal-ish shape).
            frac = min(1.0, math.exp(torch.randn((), generator=gen).item() * 0.5 - 1.0))
            n = max(2, int(frac * (max_new_tokens - 1)))
        response = torch.randint(3, vocab_size, (n,), generator=gen, dtype=torch.int32)
        if not hit_limit:
            response[-1] = eos_token_id
        logprobs = (-(torch.rand(n, generator=gen) ** 2) * 3.0).tolist()
        # Asynchronous RL: a completion may start under an older policy and, with
        # interruptible generation, finish under a newer one.
        lag = int(torch.randint(0, max_staleness + 1, (), generator=gen).item())
        head = max(0, version - lag)
        switch = int(torch.randint(0, n, (), generator=gen).item())
        versions = [head] * switch + [min(version, head + 1)] * (n - switch)
        episode = ac.rlvr_episode(
            prompt.tolist(), response.tolist(), logprobs, versions, rewards[i]
        )
        if multi_turn and n > 8:
            # A tool reply in the middle of the completion: not trained on, a new turn.
            mid = prompt_len + n // 2
            episode["loss_mask"][0, mid : mid + 4] = 0
            episode["logprobs"][0, mid : mid + 4] = 0.0
            episode["versions"][0, mid : mid + 4] = -1
            episode["turn_ids"][0, mid : prompt_len + n] = 1
        episodes.append(episode)
    group = ac.concat_padded_tensors(episodes)
    if with_prox_logp:
        # Padding of versions is 0 after concat_padded_tensors (pad_value 0.0), as in AReaL.
        drift = torch.randn(group["logprobs"].shape, generator=gen) * prox_drift
        next_mask = torch.roll(group["loss_mask"], shifts=-1, dims=-1).float()
        group["prox_logp"] = (ac.next_token_logp(group["logprobs"]) + drift) * next_mask
    return group


def make_trajectory(
    step: int,
    *,
    n_groups: int = 8,
    group_size: int = 8,
    prompt_len: tuple[int, int] = (16, 96),
    max_new_tokens: int = 128,
    version: int | None = None,
    seed: int = 0,
    equal_reward_fraction: float = 0.25,
    **group_options: Any,
) -> list[dict[str, torch.Tensor]]:
    """The content of one `step_NNNNNN.pt`: a list of `n_groups` prompt groups."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    groups = []
    for k in range(n_groups):
        plen = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (), generator=gen).item())
        groups.append(
            make_group(
                gen,
                group_size=group_size,
                prompt_len=plen,
                max_new_tokens=max_new_tokens,
                version=step if version is None else version,
                equal_rewards=k < round(equal_reward_fraction * n_groups),
                **group_options,
            )
        )
    return groups


def step_file_name(step: int, dp_rank: int | None = None) -> str:
    """AReaL's names: `step_000003.pt`, or `step_000003_dp_1.pt` per data-parallel rank."""
    return f"step_{step:06d}.pt" if dp_rank is None else f"step_{step:06d}_dp_{dp_rank}.pt"


def write_trajectory_dump(
    directory: str | Path,
    steps: Iterable[int] = (0, 1, 2),
    *,
    dp_size: int | None = None,
    length_growth: float = 0.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    **options: Any,
) -> list[Path]:
    """A dump directory, one file per step (per dp rank when `dp_size` is given).

    `length_growth` makes each step's completions longer than the last (by that fraction),
    the pattern AReaL warns about when it comes with a rising no_eos_ratio.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, step in enumerate(steps):
        budget = int(max_new_tokens * (1.0 + length_growth) ** i)
        ranks: list[int | None] = [None] if dp_size is None else list(range(dp_size))
        for rank in ranks:
            data = make_trajectory(
                step,
                max_new_tokens=budget,
                seed=seed * 31 + (rank or 0),
                **options,
            )
            path = out / step_file_name(step, rank)
            torch.save(data, path)
            written.append(path)
    return written


def write_dict_batch(
    path: str | Path, *, n_groups: int = 4, group_size: int = 4, seed: int = 0, step: int = 5
) -> Path:
    """One dict of `[B, T]` tensors: the groups as the actor batches them (concat_batch,
    areal/utils/data.py:369-390), what `torch.save(batch, ...)` in a debugger writes."""
    groups = make_trajectory(step, n_groups=n_groups, group_size=group_size, seed=seed)
    batch = ac.concat_padded_tensors(groups)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(batch, out)
    return out


def write_text_rollout_dump(
    root: str | Path,
    versions: Iterable[int] = (1, 2),
    *,
    tasks: int = 3,
    samples_per_task: int = 4,
    seed: int = 0,
) -> Path:
    """`<root>/rollout/<version>/<task_id>.jsonl`, AReaL's `rollout.dump_to_file` layout."""
    gen = torch.Generator().manual_seed(seed)
    base = Path(root) / "rollout"
    words = ["the", "answer", "is", "so", "we", "add", "then", "check", "x", "=", "3", "7"]
    for version in versions:
        vdir = base / str(version)
        vdir.mkdir(parents=True, exist_ok=True)
        for t in range(tasks):
            task_id = f"task{version:03d}{t:02d}"
            prompt = f"Question {t} at version {version}: what is {t} + {version}?"
            lines = []
            same = t == 0  # one task whose samples all got the same reward
            for s in range(samples_per_task):
                n = int(torch.randint(4, 40, (), generator=gen).item())
                idx = torch.randint(0, len(words), (n,), generator=gen).tolist()
                completion = " ".join(words[j] for j in idx)
                prompt_len = 12 + t
                reward = 1.0 if same else float(torch.randint(0, 2, (), generator=gen).item())
                lines.append(
                    json.dumps(
                        {
                            "task_id": task_id,
                            "sample_idx": s,
                            "seqlen": prompt_len + n,
                            "prompt_len": prompt_len,
                            "head_version": max(0, version - (s % 2)),
                            "tail_version": version,
                            "reward": reward,
                            "prompt": prompt,
                            "completion": completion,
                        }
                    )
                )
            (vdir / f"{task_id}.jsonl").write_text("\n".join(lines) + "\n")
    return base


def write_checkpoint(
    path: str | Path, *, layers: int = 2, hidden: int = 64, vocab: int = 1000
) -> Path:
    """A small causal-LM-shaped state_dict: what a batch browser must not mistake for data."""
    gen = torch.Generator().manual_seed(1)
    sd: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16)
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (
            ("self_attn.q_proj.weight", (hidden, hidden)),
            ("self_attn.k_proj.weight", (hidden, hidden)),
            ("self_attn.v_proj.weight", (hidden, hidden)),
            ("self_attn.o_proj.weight", (hidden, hidden)),
            ("mlp.up_proj.weight", (4 * hidden, hidden)),
            ("mlp.down_proj.weight", (hidden, 4 * hidden)),
            ("input_layernorm.weight", (hidden,)),
        ):
            sd[p + name] = torch.randn(*shape, generator=gen).to(torch.bfloat16)
    sd["lm_head.weight"] = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, out)
    return out


def write_model_config(directory: str | Path, eos_token_id: int | list[int] = EOS_TOKEN_ID) -> Path:
    """A `generation_config.json` next to a dump: where the browser finds the EOS id."""
    out = Path(directory) / "generation_config.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"eos_token_id": eos_token_id, "pad_token_id": PAD_TOKEN_ID}))
    return out


def write_large_trajectory(
    path: str | Path,
    target_bytes: int,
    *,
    seed: int = 0,
    group_size: int = 16,
    width: int = 4096,
    with_prox_logp: bool = True,
) -> Path:
    """A dump of about `target_bytes`, built fast from big groups (benchmarks, size tests).

    Per token it stores 6 x 4-byte tensors plus a bool mask (25 bytes with prox_logp).
    """
    gen = torch.Generator().manual_seed(seed)
    per_token = 25 if with_prox_logp else 21
    n_groups = max(1, target_bytes // (per_token * group_size * width))
    groups = []
    for k in range(n_groups):
        plen = int(torch.randint(64, 1024, (), generator=gen).item())
        lens = torch.randint(plen + 16, width + 1, (group_size,), generator=gen)
        lens[0] = width  # the group's longest sample sets its width
        pos = torch.arange(width).unsqueeze(0)
        attn = pos < lens.unsqueeze(1)
        resp = attn & (pos >= plen)
        ids = torch.randint(3, VOCAB_SIZE, (group_size, width), generator=gen, dtype=torch.int32)
        ids = ids * attn
        last = (lens - 1).clamp(min=0)
        no_eos = torch.rand(group_size, generator=gen) < 0.03
        rows = torch.arange(group_size)
        eos = torch.tensor(EOS_TOKEN_ID, dtype=torch.int32)
        ids[rows, last] = torch.where(no_eos, ids[rows, last], eos)
        logp = -torch.rand(group_size, width, generator=gen) * resp
        versions = torch.where(
            resp, torch.tensor(k % 3, dtype=torch.int32), torch.tensor(-1, dtype=torch.int32)
        )
        group = {
            "input_ids": ids,
            "loss_mask": resp.to(torch.int32),
            "logprobs": logp,
            "versions": versions,
            "turn_ids": torch.zeros(group_size, width, dtype=torch.int32),
            "attention_mask": attn,
            "rewards": (torch.rand(group_size, generator=gen) < 0.5).float(),
        }
        if with_prox_logp:
            noise = torch.randn(group_size, width, generator=gen) * 0.02
            group["prox_logp"] = (logp + noise) * resp
        groups.append(group)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(groups, out)
    return out


# --------------------------------------------------------------------------------------
# The variants AReaL writes beside plain RLVR groups


def _episode_parts(
    gen: torch.Generator, prompt: list[int], n: int, *, eos: bool, version: int = 0
) -> tuple[list[int], list[float], list[int]]:
    response = torch.randint(3, VOCAB_SIZE, (n,), generator=gen, dtype=torch.int32).tolist()
    if eos:
        response[-1] = EOS_TOKEN_ID
    logprobs = (-(torch.rand(n, generator=gen) ** 2) * 3.0).tolist()
    return response, logprobs, [version] * n


def on_policy_group(
    gen: torch.Generator, *, group_size: int = 4, prompt_len: int = 12, max_new_tokens: int = 24
) -> dict[str, Any]:
    """A group whose proximal policy is the behaviour policy (on-policy, nothing stale):
    `prox_logp` is exactly what `compute_logp` returns for it, so pi_prox/pi_behave is 1."""
    prompt = torch.randint(3, VOCAB_SIZE, (prompt_len,), generator=gen).tolist()
    episodes = []
    for i in range(group_size):
        n = max_new_tokens if i == 0 else int(torch.randint(4, max_new_tokens, (), generator=gen))
        resp, logp, vers = _episode_parts(gen, prompt, n, eos=i != 0)
        episodes.append(ac.rlvr_episode(prompt, resp, logp, vers, float(i % 2)))
    group = ac.concat_padded_tensors(episodes)
    group["prox_logp"] = ac.next_token_logp(group["logprobs"])
    return group


def teacher_group(
    gen: torch.Generator, *, rl_loss_weight: float, distill_loss_weight: float
) -> dict[str, Any]:
    """A group after the teacher step of on-policy distillation: `teacher_logp` plus the two
    loss weights as Python floats (rl_trainer.py:758-763)."""
    group = on_policy_group(gen)
    teacher = ac.next_token_logp(group["logprobs"]) + 0.1
    ac.add_teacher(group, teacher, rl_loss_weight, distill_loss_weight)
    return group


def vision_group(gen: torch.Generator, *, group_size: int = 3) -> dict[str, Any]:
    """A VisionRLVRWorkflow group: per-sample `multi_modal_input` dicts (pixel_values,
    image_grid_thw), int64 token ids, `mm_token_type_ids`."""
    prompt = torch.randint(3, VOCAB_SIZE, (10,), generator=gen).tolist()
    mm_types = [0] * 4 + [1] * 4 + [0] * 2
    episodes = []
    for i in range(group_size):
        resp, logp, vers = _episode_parts(gen, prompt, 6 + 2 * i, eos=True)
        patches = 16 + 4 * i
        episodes.append(
            ac.vision_episode(
                prompt,
                mm_types,
                resp,
                logp,
                vers,
                float(i == 0),
                pixel_values=torch.randn(patches, 1176, generator=gen),
                image_grid_thw=torch.tensor([[1, 4, patches // 4]]),
            )
        )
    return ac.concat_padded_tensors(episodes)


def agent_group(gen: torch.Generator, *, task_id: str, group_size: int = 4) -> dict[str, Any]:
    """An agent-workflow group with `gconfig.reward_normalization`: `rewards` are
    group-normalised, `original_rewards` the task's; plus a workflow's own `task_id` string
    (check_trajectory_format accepts non-tensor entries, workflow_executor.py:211-212)."""
    prompt = torch.randint(3, VOCAB_SIZE, (8,), generator=gen).tolist()
    raw = [1.0] + [0.0] * (group_size - 1)
    normalised = ac.normalize_group_rewards(raw)
    episodes = []
    for i in range(group_size):
        resp, logp, vers = _episode_parts(gen, prompt, 5 + i, eos=True)
        ep: dict[str, Any] = ac.interaction_episode(prompt, resp, logp, vers, normalised[i], raw[i])
        ep["task_id"] = task_id
        episodes.append(ep)
    return ac.concat_padded_tensors(episodes)


def write_step(
    directory: str | Path, step: int, groups: list[dict[str, Any]], dp_rank: int | None = None
) -> Path:
    """Save one step's batch under AReaL's name for it (PR #1407 rl_trainer.py:1371-1388)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = ac.trajectory_path(str(directory), step, dp_rank)
    ac.save_trajectory(groups, path)
    return Path(path)


def write_single_controller_step(
    directory: str | Path, step: int, groups: list[dict[str, Any]], workers: list[str]
) -> Path:
    """What the controller saves in single-controller mode: each group as the rollout
    worker that made it returned it, remotized into RTensor references (rtensor.py:371-425,
    engine_blueprint.py:607-609), pickled with AReaL's own class names."""
    with ac.rtensor_module() as module:
        refs = [ac.remotize(module, g, workers[i % len(workers)]) for i, g in enumerate(groups)]
        return write_step(directory, step, refs)
