"""The transcriptions in tests/support/fixtures/areal_code.py against AReaL's own source.

AReaL's functions are taken out of its source with `ast` and run next to ours on the same
inputs, for two versions of AReaL (tests/support/areal_source.py): the release `areal 1.0.4` from
the package index, always (the tensor helpers and RTensor are the same there as at the
cited commit), and the cited commit cbff54d itself where `$AREAL_REPO` names a checkout
with it (skipped, saying so, otherwise). Every file:line the transcriptions cite is checked
by test_areal_citations.py.
"""

from __future__ import annotations

import ast
import copy
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from areal_node import batches as b

from tests.support.areal_source import AReaLSource
from tests.support.fixtures import areal_code as ac
from tests.support.fixtures import batch_dumps as bf


def _functions(source: str, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Exec only the named top-level functions/classes of `source` into `namespace`."""
    tree = ast.parse(source)
    wanted = [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names
    ]
    assert {n.name for n in wanted} == names
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(module, "<areal>", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def areal_data(areal: AReaLSource) -> dict[str, Any]:
    source = areal.read("areal/utils/data.py")
    ns: dict[str, Any] = {"torch": torch, "F": F, "Any": Any, "copy": copy}
    return _functions(
        source,
        {
            "get_batch_size",
            "is_multi_modal_key",
            "_pad_cat_dim0",
            "concat_padded_tensors",
            "_unpad_splits",
            "split_and_unpad_tensor",
        },
        ns,
    )


def _equal(a: Any, b_: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b_, torch.Tensor) and a.dtype == b_.dtype and torch.equal(a, b_)
    if isinstance(a, dict):
        return (
            isinstance(b_, dict) and a.keys() == b_.keys() and all(_equal(a[k], b_[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b_) and all(_equal(x, y) for x, y in zip(a, b_, strict=True))
    return bool(a == b_)


def test_concat_padded_tensors_matches_areal(areal_data: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(0)
    cases = [
        [bf.vision_group(gen), bf.vision_group(gen)],  # multi_modal_input lists
        [bf.agent_group(gen, task_id="a"), bf.agent_group(gen, task_id="b")],  # strings
        [
            bf.teacher_group(gen, rl_loss_weight=1.0, distill_loss_weight=0.5),
            bf.teacher_group(gen, rl_loss_weight=1.0, distill_loss_weight=0.5),
        ],
        bf.make_trajectory(3, n_groups=3, group_size=2, with_prox_logp=True),
    ]
    for groups in cases:
        ours = ac.concat_padded_tensors(copy.deepcopy(groups))
        theirs = areal_data["concat_padded_tensors"](copy.deepcopy(groups))
        assert _equal(ours, theirs)


def test_split_and_unpad_matches_areal(areal_data: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(1)
    batch = ac.concat_padded_tensors([bf.on_policy_group(gen), bf.on_policy_group(gen)])
    for sizes in ([8], [4, 4]):
        ours = ac.split_and_unpad_tensor(copy.deepcopy(batch), len(sizes), sizes)
        theirs = areal_data["split_and_unpad_tensor"](copy.deepcopy(batch), len(sizes), sizes)
        assert _equal(ours, theirs)


def test_rtensor_pickles_as_areal_pickles_it(
    tmp_path: Path, areal: AReaLSource, areal_data: dict[str, Any]
) -> None:
    """AReaL's own RTensor classes and remotize, run with an in-memory shard store, write the
    same file structure as the transcription, and the console reads both the same way."""
    source = areal.read("areal/infra/rpc/rtensor.py")
    counter = iter(range(10**6))

    class Store:
        def store(self, tensor: torch.Tensor) -> str:
            return f"shard-{next(counter)}"

    from dataclasses import dataclass

    module = types.ModuleType(ac.RTENSOR_MODULE)
    module.__dict__.update(
        {"dataclass": dataclass, "Any": Any, "torch": torch, "get_backend": lambda: Store()}
    )
    data_module = types.ModuleType("areal.utils.data")
    data_module.split_and_unpad_tensor = areal_data["split_and_unpad_tensor"]  # type: ignore[attr-defined]
    saved = {
        k: sys.modules.get(k)
        for k in (
            "areal",
            "areal.infra",
            "areal.infra.rpc",
            "areal.utils",
            "areal.utils.data",
            ac.RTENSOR_MODULE,
        )
    }
    try:
        for name in ("areal", "areal.infra", "areal.infra.rpc", "areal.utils"):
            sys.modules[name] = types.ModuleType(name)
        sys.modules["areal.utils.data"] = data_module
        sys.modules[ac.RTENSOR_MODULE] = module
        _functions(source, {"TensorShardInfo", "RTensor"}, module.__dict__)
        gen = torch.Generator().manual_seed(2)
        groups = [
            bf.teacher_group(gen, rl_loss_weight=1.0, distill_loss_weight=0.5) for _ in range(2)
        ]
        theirs = [module.RTensor.remotize(g, node_addr="10.0.0.9:5000") for g in groups]
        ac.save_trajectory(theirs, str(tmp_path / "step_000000.pt"))
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    ours = bf.write_single_controller_step(tmp_path / "ours", 0, groups, ["10.0.0.9:5000"])
    a = b.summarize(str(tmp_path / "step_000000.pt"))
    c = b.summarize(str(ours))
    assert a["format"] == c["format"] == b.TRAJECTORY_REFS
    assert a["keys"] == c["keys"] and a["remote"] == c["remote"] and a["samples"] == c["samples"]
