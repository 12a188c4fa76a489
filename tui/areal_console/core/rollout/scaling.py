"""How AReaL scales the staleness capacity: by the job's mode and its data-parallel size.

At AReaL cbff54d:
- SPMD mode (`AREAL_SPMD_MODE=1`, which the local/Ray/Slurm launchers set,
  areal/infra/launcher/local.py:418; `is_single_controller()`, areal/utils/environ.py:74-75)
  gives each rank its own `StalenessManager`, with `max_concurrent_rollouts` (None: the
  consumer batch size) and `consumer_batch_size` divided by the data-parallel size,
  `max(1, x // dp)` (areal/infra/workflow_executor.py:786-789, 1069-1085). The trainer
  passes `dp` = the data-parallel size of `actor.backend` (areal/trainer/rl_trainer.py:151,
  1242-1246); without it the executor takes the process group's world size
  (`_resolve_dp_world_size`, workflow_executor.py:813-824).
- Single-controller mode (the variable unset: AReaL's default) keeps one manager in the
  controller with the global values, `max_concurrent_rollouts or consumer_batch_size`, no
  division (areal/infra/controller/rollout_controller.py:204-213; the v2 controller,
  areal/v2/inference_service/controller/controller.py:260-268); its workers' executors
  get dp 1 (rollout_controller.py:268-275).

`actor.backend` is one component of AReaL's allocation grammar
(`ModelAllocation.from_str`, areal/api/alloc_mode.py:286-351; the grammar :594-635):
`BACKEND[NAME]:DIMS` with DIMS letters `d` (data), `t`, `p`, `c`, `e` and a number each
(inference backends `d`, `t`, `p`), or the MoE form `BACKEND:(attn:DIMS|ffn:DIMS)` whose
data-parallel size is the attention part's `d` (:957-1055). A dimension left out is 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from areal_node.constants import config_key

from areal_console.core.common.errors import UserError

SPMD = "spmd"
SINGLE_CONTROLLER = "single-controller"
SPMD_VAR = "AREAL_SPMD_MODE"
BACKEND_KEY = config_key("actor.backend")
_TRUTHY = ("true", "1")  # get_bool_env_var's defaults (areal/utils/environ.py:39), lowered
RPC_SERVER = "areal.infra.rpc.rpc_server"  # single-controller workers run this module

_TRAIN = ("fsdp", "megatron", "archon")
_INFER = ("sglang", "vllm")
_HEAD = re.compile(r"^(fsdp|megatron|archon|sglang|vllm)(?:\[[A-Za-z_][A-Za-z0-9_]*\])?:(.*)$")
_DIMS = re.compile(r"^(?:[a-z][1-9][0-9]{0,6})+$")
_DIM = re.compile(r"([a-z])([1-9][0-9]{0,6})")
_HYBRID = re.compile(r"^\(?attn:([a-z0-9]+)\|ffn:([a-z0-9]+)\)?$")
MAX_SPEC = 200


def _dims(text: str, allowed: str) -> dict[str, int]:
    if not _DIMS.match(text):
        raise UserError(f"{text!r} is not a list of parallel dimensions")
    out = {}
    for letter, size in _DIM.findall(text):
        if letter not in allowed:
            raise UserError(f"dimension {letter!r} is not one of {', '.join(allowed)}")
        out[letter] = int(size)  # a repeated letter: the last one counts, as in AReaL
    return out


def data_parallel_size(spec: str) -> int:
    """The data-parallel size of one allocation component such as `fsdp:d4p1t1` or
    `megatron:(attn:d2p1t4|ffn:d1p1e8)` (UserError: not one AReaL accepts)."""
    if len(spec) > MAX_SPEC:
        raise UserError(f"longer than {MAX_SPEC} characters")
    text = re.sub(r"\s+", "", spec)  # the grammar ignores whitespace
    if "+" in text:
        raise UserError("a multi-component allocation (AReaL wants one per engine)")
    m = _HEAD.match(text)
    if m is None:
        raise UserError("no backend prefix (fsdp, megatron, archon, sglang or vllm)")
    backend, body = m.groups()
    if backend in _INFER:
        return _dims(body, "dtp").get("d", 1)
    hybrid = _HYBRID.match(body)
    if hybrid is not None:
        attn = _dims(hybrid.group(1), "cdtp")
        _dims(hybrid.group(2), "detp")
        return attn.get("d", 1)
    return _dims(body, "pdtce").get("d", 1)


def _label(p: Mapping[str, Any]) -> str:
    return f"{p.get('role') or 'process'} {p.get('pid')}"


def job_mode(procs: Iterable[Mapping[str, Any]]) -> tuple[str | None, str]:
    """(SPMD, SINGLE_CONTROLLER or None: not known, the evidence) from the agent's process
    records: `AREAL_SPMD_MODE` true in a process's environment is SPMD; a single-controller
    worker (`python -m areal.infra.rpc.rpc_server`, or the controller above one) is the
    other mode."""
    procs = list(procs)
    for p in procs:
        env = p.get("env")
        value = env.get(SPMD_VAR) if isinstance(env, Mapping) else None
        if isinstance(value, str) and value.lower() in _TRUTHY:
            return SPMD, f"{SPMD_VAR}={value} in the environment of {_label(p)}"
    for p in procs:
        if RPC_SERVER in str(p.get("cmdline") or "") or p.get("role") == "controller":
            return SINGLE_CONTROLLER, f"single-controller {_label(p)} (`{RPC_SERVER}` workers)"
    return None, f"no process shows {SPMD_VAR} or a single-controller worker"


@dataclass(frozen=True, slots=True)
class Scaling:
    """The data-parallel size the capacity is divided by, where it came from, and a note
    when it was assumed."""

    mode: str | None
    mode_evidence: str
    dp_size: int
    source: str
    note: str | None = None


def scaling(
    mode: str | None, evidence: str, backend: Mapping[str, Any] | None, world_size: int | None
) -> Scaling:
    """The divisor AReaL uses in `mode`, from `actor.backend` (`{"value", "from"}`) or,
    as AReaL falls back, the ranks' world size."""
    if mode == SINGLE_CONTROLLER:
        return Scaling(mode, evidence, 1, "single-controller mode: one global manager, not divided")
    spec = backend.get("value") if isinstance(backend, Mapping) else None
    dp, why = None, f"{BACKEND_KEY} not found in the run's config"
    if isinstance(spec, str):
        try:
            dp = data_parallel_size(spec)
        except UserError as exc:
            why = f"{BACKEND_KEY} {spec[:80]!r} not understood: {exc}"
    if mode is None:
        scaled = f": in SPMD mode each rank's would be divided by dp {dp}" if dp else ""
        note = (
            f"The job's mode is not known ({evidence}): AReaL's default, single-controller, "
            f"assumed (dp 1){scaled}"
        )
        return Scaling(mode, evidence, 1, "assumed (the mode is not known)", note)
    if dp is not None:
        where = backend.get("from") if isinstance(backend, Mapping) else None
        return Scaling(mode, evidence, dp, f"{BACKEND_KEY} {spec!r} ({where})")
    if world_size and world_size > 0:
        note = (
            f"dp not known ({why}): assumed the ranks' world size {world_size}, "
            "as AReaL does without it"
        )
        return Scaling(mode, evidence, world_size, "assumed (the ranks' world size)", note)
    note = f"dp not known ({why}) nor the ranks' world size: assumed 1"
    return Scaling(mode, evidence, 1, "assumed (not known)", note)
