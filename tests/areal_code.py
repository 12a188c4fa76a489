"""AReaL's own code that shapes dumped batches, transcribed for building test fixtures.

Each function is a faithful transcription of AReaL's (areal-project/AReaL at commit
cbff54d645d2cd8ee1f1c358a82f3f473588433d unless noted), cited by file:line, so that the
fixtures are the bytes AReaL would write. tests/test_areal_code.py runs AReaL's own
functions (extracted from the source with `ast`) against these when an AReaL checkout
is available, and fails if they disagree.

The trajectory dump feature itself is AReaL pull request #1407 (refs/pull/1407/head,
commit 6250a6e8c0ac17336f5f272c2267014f60eb0409), not yet merged at that commit:
`_trajectory_path` / `_save_trajectory` are at areal/trainer/rl_trainer.py:1371-1388 there.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

AREAL_COMMIT = "cbff54d645d2cd8ee1f1c358a82f3f473588433d"
PR_1407_COMMIT = "6250a6e8c0ac17336f5f272c2267014f60eb0409"


# --------------------------------------------------------------------------------------
# areal/utils/data.py


def get_batch_size(data: dict[str, Any]) -> int:
    """areal/utils/data.py:27-47."""
    if not data:
        return 0

    am = data.get("attention_mask")
    if torch.is_tensor(am) and am.ndim >= 1:
        return int(am.shape[0])

    cu = data.get("cu_seqlens")
    if torch.is_tensor(cu) and cu.ndim >= 1 and cu.numel() >= 1:
        return max(int(cu.shape[0]) - 1, 0)

    mmi = data.get("multi_modal_input")
    if isinstance(mmi, list):
        return len(mmi)

    for v in data.values():
        if torch.is_tensor(v) and v.ndim >= 1:
            return int(v.shape[0])

    return 0


def is_multi_modal_key(key: str) -> bool:
    """areal/utils/data.py:88-90."""
    return key.startswith("multi_modal_input")


def _pad_cat_dim0(tensors: list[torch.Tensor], pad_value: float = 0.0) -> torch.Tensor:
    """areal/utils/data.py:204-238."""
    if not tensors:
        raise ValueError("_pad_cat_dim0 requires a non-empty list of tensors.")
    ndim = tensors[0].ndim
    if ndim <= 1:
        return torch.cat(tensors, dim=0)
    max_shape = [0] * (ndim - 1)
    for t in tensors:
        if t.ndim != ndim:
            raise ValueError(f"Dimension mismatch: expected {ndim}D tensors, got {t.ndim}D")
        for i in range(1, ndim):
            max_shape[i - 1] = max(max_shape[i - 1], t.shape[i])
    padded_tensors = []
    for t in tensors:
        pad_sizes = [max_shape[i - 1] - t.shape[i] for i in range(1, ndim)]
        if any(pad_sizes):
            pad: list[int] = []
            for ps in reversed(pad_sizes):
                pad.extend([0, ps])
            t = F.pad(t, tuple(pad), "constant", pad_value)
        padded_tensors.append(t)
    return torch.cat(padded_tensors, dim=0)


def concat_padded_tensors(
    tensor_dicts: list[dict[str, Any]], pad_value: float = 0.0
) -> dict[str, Any]:
    """areal/utils/data.py:241-298: how a group (and a rank's batch) is put together."""
    if not tensor_dicts:
        return {}
    if len(tensor_dicts) == 1:
        return dict(tensor_dicts[0])
    first_keys = set(tensor_dicts[0].keys())
    for i, d in enumerate(tensor_dicts[1:], 1):
        if set(d.keys()) != first_keys:
            raise ValueError(
                f"concat_padded_tensors: dict[{i}] has different keys than dict[0]. "
                f"Expected {sorted(first_keys)}, got {sorted(d.keys())}"
            )
    result: dict[str, Any] = {}
    multimodal_keys = {key for td in tensor_dicts for key in td if is_multi_modal_key(key)}
    for mm_key in multimodal_keys:
        merged_multi_modal: list[Any] = []
        for td in tensor_dicts:
            bs = get_batch_size(td)
            merged_multi_modal.extend(td.get(mm_key, [{} for _ in range(bs)]))
        result[mm_key] = merged_multi_modal
    for key in tensor_dicts[0]:
        if key in multimodal_keys:
            continue
        values = [td[key] for td in tensor_dicts]
        if isinstance(values[0], torch.Tensor):
            pv = 0.0 if key == "attention_mask" else pad_value
            result[key] = _pad_cat_dim0(values, pad_value=pv)
        elif isinstance(values[0], list):
            result[key] = [item for v in values for item in v]
        else:
            result[key] = values[0]
    return result


def _unpad_splits(splits: list[torch.Tensor], traj_seqlens: list[int] | None) -> list[torch.Tensor]:
    """areal/utils/data.py:301-310."""
    if traj_seqlens is None:
        return splits
    for i, s in enumerate(splits):
        if s.ndim >= 2 and s.shape[-1] > traj_seqlens[i]:
            splits[i] = s[..., : traj_seqlens[i]]
    return splits


def split_and_unpad_tensor(
    result: Any,
    n_trajs: int,
    traj_group_sizes: list[int] | int = 1,
    traj_seqlens: list[int] | None = None,
) -> Any:
    """areal/utils/data.py:313-358 (RTensor.remotize trims trajectories with it)."""
    if result is None:
        return None
    if isinstance(traj_group_sizes, int):
        traj_group_sizes = [traj_group_sizes] * n_trajs
    total = sum(traj_group_sizes)
    if traj_seqlens is None and isinstance(result, dict):
        attn_mask = result.get("attention_mask")
        if isinstance(attn_mask, torch.Tensor) and attn_mask.ndim >= 2:
            am_splits = list(attn_mask.split(traj_group_sizes, dim=0))
            derived = [int(am.sum(-1).max().item()) for am in am_splits]
            if any(sl < attn_mask.shape[-1] for sl in derived):
                traj_seqlens = derived
    if isinstance(result, torch.Tensor):
        splits = list(result.split(traj_group_sizes, dim=0))
        return _unpad_splits(splits, traj_seqlens)
    if isinstance(result, dict):
        split_result: list[dict[str, Any]] = [{} for _ in range(n_trajs)]
        for key, value in result.items():
            if isinstance(value, torch.Tensor) and value.shape[0] == total:
                splits = _unpad_splits(list(value.split(traj_group_sizes, dim=0)), traj_seqlens)
                for i, s in enumerate(splits):
                    split_result[i][key] = s
            else:
                for i in range(n_trajs):
                    split_result[i][key] = copy.deepcopy(value)
        return split_result
    return result


# --------------------------------------------------------------------------------------
# What workflows return per episode (batch dimension 1)


def rlvr_episode(
    input_tokens: list[int],
    output_tokens: list[int],
    output_logprobs: list[float],
    output_versions: list[int],
    reward: float,
) -> dict[str, torch.Tensor]:
    """areal/workflow/rlvr.py:163-180 (RLVRWorkflow.arun_episode's result)."""
    input_len, output_len = len(input_tokens), len(output_tokens)
    seq = input_tokens + output_tokens
    logprobs = [0.0] * input_len + output_logprobs
    loss_mask = [0] * input_len + [1] * output_len
    versions = [-1] * input_len + output_versions
    turn_ids = [-1] * input_len + [0] * output_len
    res = {
        "input_ids": torch.tensor(seq, dtype=torch.int32),
        "loss_mask": torch.tensor(loss_mask, dtype=torch.int32),
        "logprobs": torch.tensor(logprobs, dtype=torch.float32),
        "versions": torch.tensor(versions, dtype=torch.int32),
        "turn_ids": torch.tensor(turn_ids, dtype=torch.int32),
        "attention_mask": torch.ones(len(seq), dtype=torch.bool),
        "rewards": torch.tensor(reward, dtype=torch.float32),
    }
    return {k: v.unsqueeze(0) for k, v in res.items()}


def vision_episode(
    input_tokens: list[int],
    mm_token_type_ids: list[int],
    output_tokens: list[int],
    output_logprobs: list[float],
    output_versions: list[int],
    reward: float,
    pixel_values: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
) -> dict[str, Any]:
    """areal/workflow/vision_rlvr.py:141-170 (VisionRLVRWorkflow.arun_episode's result)."""
    input_len, output_len = len(input_tokens), len(output_tokens)
    seq = input_tokens + output_tokens
    mm_token_type_ids = mm_token_type_ids + [0] * output_len
    logprobs = [0.0] * input_len + output_logprobs
    loss_mask = [0] * input_len + [1] * output_len
    versions = [-1] * input_len + output_versions
    turn_ids = [-1] * input_len + [0] * output_len
    multi_modal_input: list[dict[str, Any]] = [{"pixel_values": pixel_values}]
    if image_grid_thw is not None:
        multi_modal_input[0]["image_grid_thw"] = image_grid_thw
    return {
        "input_ids": torch.tensor(seq, dtype=torch.long).unsqueeze(0),
        "mm_token_type_ids": torch.tensor(mm_token_type_ids, dtype=torch.long).unsqueeze(0),
        "loss_mask": torch.tensor(loss_mask, dtype=torch.int32).unsqueeze(0),
        "logprobs": torch.tensor(logprobs, dtype=torch.float32).unsqueeze(0),
        "multi_modal_input": multi_modal_input,
        "versions": torch.tensor(versions, dtype=torch.int32).unsqueeze(0),
        "turn_ids": torch.tensor(turn_ids, dtype=torch.int32).unsqueeze(0),
        "attention_mask": torch.ones(len(seq), dtype=torch.bool).unsqueeze(0),
        "rewards": torch.tensor(reward, dtype=torch.float32).unsqueeze(0),
    }


def interaction_episode(
    input_tokens: list[int],
    output_tokens: list[int],
    output_logprobs: list[float],
    output_versions: list[int],
    reward: float,
    original_reward: float,
) -> dict[str, torch.Tensor]:
    """areal/experimental/openai/types.py:201-225 (an agent interaction's tensor dict).

    Agent workflows with `gconfig.reward_normalization` store the group-normalised reward
    in `rewards` and the task's own in `original_rewards` (remote_inf_engine.py:164-200).
    """
    input_len, output_len = len(input_tokens), len(output_tokens)
    seq = input_tokens + output_tokens
    logprobs = [0.0] * input_len + output_logprobs
    loss_mask = [0] * input_len + [1] * output_len
    versions = [-1] * input_len + output_versions
    turn_ids = [-1] * input_len + [0] * output_len
    return dict(
        input_ids=torch.tensor(seq).unsqueeze(0),
        loss_mask=torch.tensor(loss_mask).unsqueeze(0),
        logprobs=torch.tensor(logprobs).unsqueeze(0),
        versions=torch.tensor(versions).unsqueeze(0),
        turn_ids=torch.tensor(turn_ids, dtype=torch.int32).unsqueeze(0),
        attention_mask=torch.ones(len(seq), dtype=torch.bool).unsqueeze(0),
        rewards=torch.tensor([float(reward)]),
        original_rewards=torch.tensor([float(original_reward)]),
    )


def normalize_group_rewards(rewards: list[float]) -> list[float]:
    """areal/infra/remote_inf_engine.py:190-193 (_normalize_group_rewards)."""
    r = torch.tensor(rewards, dtype=torch.float32)
    mean = r.mean()
    std = r.std(unbiased=False) if r.numel() > 1 else torch.tensor(1.0)
    return ((r - mean) / (std + 1e-8)).tolist()


# --------------------------------------------------------------------------------------
# The trainer's enrichment and the dump (PR #1407, areal/trainer/rl_trainer.py)


def next_token_logp(token_logp: torch.Tensor) -> torch.Tensor:
    """What `compute_logp` returns for a trajectory: position t scores token t+1.

    The engine's forward gathers the log-probability of the *next* label at each position
    (actor.py:167-172; the actor then rolls logprobs/loss_mask by -1 to match,
    actor.py:214-215, 239). Given per-token log-probabilities `token_logp[:, t] =
    log p(ids[t] | ids[:t])`, that is `token_logp` shifted left by one, 0 at the end.
    """
    out = torch.zeros_like(token_logp)
    out[:, :-1] = token_logp[:, 1:]
    return out


def add_teacher(
    traj: dict[str, Any], teacher_logp: torch.Tensor, rl_loss_weight: float, distill: float
) -> None:
    """rl_trainer.py:758-763 at cbff54d6 (PR #1407: 803-810): Python floats beside tensors."""
    traj["teacher_logp"] = teacher_logp
    traj["rl_loss_weight"] = rl_loss_weight
    traj["distill_loss_weight"] = distill


def trajectory_path(directory: str, step: int, dp_rank: int | None) -> str:
    """PR #1407 rl_trainer.py:1371-1383: `step_{step:06d}.pt` (single controller) or
    `step_{step:06d}_dp_{dp_rank}.pt` (SPMD)."""
    import os

    if dp_rank is None:
        filename = f"step_{step:06d}.pt"
    else:
        filename = f"step_{step:06d}_dp_{dp_rank}.pt"
    return os.path.join(directory, filename)


def save_trajectory(batch: list[dict[str, Any]], path: str) -> None:
    """PR #1407 rl_trainer.py:1385-1388: a plain `torch.save` of the batch."""
    torch.save(batch, path)


# --------------------------------------------------------------------------------------
# Single-controller references (areal/infra/rpc/rtensor.py)

RTENSOR_MODULE = "areal.infra.rpc.rtensor"

_RTENSOR_SOURCE = """
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TensorShardInfo:
    shard_id: Any
    node_addr: str


@dataclass
class RTensor:
    shard: TensorShardInfo
    data: torch.Tensor
"""


@contextlib.contextmanager
def rtensor_module() -> Iterator[types.ModuleType]:
    """AReaL's two dataclasses (rtensor.py:68-84 and 351-356), importable under their real
    module name while a batch is pickled (pickle stores `areal.infra.rpc.rtensor.RTensor`).

    An installed AReaL is left alone; otherwise the module exists only inside the block.
    """
    try:
        import areal.infra.rpc.rtensor as real  # type: ignore[import-not-found]

        yield real
        return
    except ImportError:
        pass
    added = []
    for name in ("areal", "areal.infra", "areal.infra.rpc"):
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            added.append(name)
    module = types.ModuleType(RTENSOR_MODULE)
    sys.modules[RTENSOR_MODULE] = module
    added.append(RTENSOR_MODULE)
    exec(compile(_RTENSOR_SOURCE, "<areal.infra.rpc.rtensor>", "exec"), module.__dict__)
    try:
        yield module
    finally:
        for name in added:
            sys.modules.pop(name, None)


_shard_counter = itertools.count()


def remotize(module: types.ModuleType, obj: Any, node_addr: str) -> Any:
    """rtensor.py:371-425 (RTensor.remotize), with the shard store left out: the data goes
    to the worker's storage, the controller keeps a meta tensor and the shard's address."""
    if obj is None:
        return None
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach().cpu()
        # AReaL draws uuid4(); a counter keeps fixtures byte-identical between runs.
        shard_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{node_addr}/{next(_shard_counter)}"))
        shard = module.TensorShardInfo(shard_id=shard_id, node_addr=node_addr)
        return module.RTensor(shard=shard, data=tensor.to("meta"))
    if isinstance(obj, dict):
        attn_mask = obj.get("attention_mask")
        if isinstance(attn_mask, torch.Tensor) and attn_mask.ndim >= 2:
            compacted = split_and_unpad_tensor(
                obj, n_trajs=1, traj_group_sizes=[attn_mask.shape[0]]
            )
            if compacted is not None:
                obj = compacted[0]
        return {k: remotize(module, v, node_addr) for k, v in obj.items()}
    if isinstance(obj, list):
        return [remotize(module, item, node_addr) for item in obj]
    if isinstance(obj, tuple):
        return tuple(remotize(module, item, node_addr) for item in obj)
    return obj
