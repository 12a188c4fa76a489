"""One training step on a batch (identical code for live and replayed batches)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from areal_node.trainer.model import Adam, TinyCausalLM

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
        for g, p in zip(groups, prox):
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
                for a, g in zip(advantages[bounds[i] : bounds[i + 1]], mb_groups)
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
