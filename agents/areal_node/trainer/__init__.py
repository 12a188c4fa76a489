"""A small but real RL trainer with AReaL's trajectory dump/replay flags.

Standard library and torch only. It runs from the node package, here or on a node:

    python3 -m areal_node.trainer [--nproc N] [--config FILE] [--default-output-dir DIR] [key=value ...]
    python3 reference_trainer.pyz ...  (the node payload run as a program: what replay runs)

`output_dir` (the per-step metrics; torchrun's own files in its `torchrun/`) defaults to
`--default-output-dir`, else `./reference-trainer-out`; `areal-console trainer` passes a
folder in its data dir.

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

import warnings

# A node's python may lack numpy; torch then warns "Failed to initialize NumPy" on import,
# into every replay log. Nothing here uses numpy. (This package's modules import torch
# after this line runs.)
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
