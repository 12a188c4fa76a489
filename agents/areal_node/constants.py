"""Names both sides agree on: the console and the code it runs on nodes import them from here.

- AReaL's dump names (`step_NNNNNN[_dp_K].pt`), which the agent, the batch reader and the
  reference trainer all match;
- the roles of AReaL's single-controller workers that train;
- the files the reference trainer writes and the metrics it logs (replay reads them);
- the AReaL config keys the console suggests: every warning, diagnosis, template and doc
  that tells the user to set an AReaL key names it through `config_key`, so a test can
  check the whole registry against the fields of AReaL's own config classes
  (`areal/api/cli_args.py`, generated into tests/data by scripts/areal_config_fields.py).
  Keys of the trajectory dump/replay feature exist only in its pull request (#1407), not
  yet on AReaL's main branch; they are marked as such.

Standard library only, Python 3.9: it runs on nodes.
"""

from __future__ import annotations

import re

# AReaL's dump names, `step_{step:06d}.pt` (single controller) or
# `step_{step:06d}_dp_{dp_rank}.pt` (SPMD), PR #1407 rl_trainer.py:1371-1383.
DUMP_FILE = re.compile(r"^step_(\d{6,})(?:_dp_(\d+))?\.pt$")


def dump_name(step: int, dp_rank: int | None) -> str:
    """The file name AReaL gives a step's dump (`dp_rank` None: one file per step)."""
    return f"step_{step:06d}.pt" if dp_rank is None else f"step_{step:06d}_dp_{dp_rank}.pt"


# The roles of AReaL's single-controller workers (`python3 -m areal.infra.rpc.rpc_server
# --role R`) that train.
TRAINING_ROLES = frozenset({"actor", "ref", "critic", "teacher"})

# The reference trainer (`python3 -m areal_node.trainer`, or the node payload run as a
# program) and what it writes next to its dumps (and to its output_dir).
TRAINER_MODULE = "areal_node.trainer"
METRICS_FILE = "metrics.jsonl"
META_FILE = "trajectory_meta.json"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_FILE = re.compile(r"^ckpt_(\d+)\.pt$")

# Metric names as AReaL's trainer logs them; the reference trainer logs these and replay
# verification compares them.
METRIC_NAMES = (
    "task_reward",
    "seq_len",
    "no_eos_ratio",
    "importance_weight",
    "behave_imp_weight",
    "actor_loss",
    "grad_norm",
)

# AReaL's main branch as checked (areal-project/AReaL).
AREAL_COMMIT = "cbff54d645d2cd8ee1f1c358a82f3f473588433d"
# The trajectory dump/replay pull request (refs/pull/1407/head), not merged at AREAL_COMMIT.
AREAL_PR_1407_COMMIT = "6250a6e8c0ac17336f5f272c2267014f60eb0409"

MAIN = "main"
PR_1407 = "pr1407"

# dotted key -> (where it exists, what the console suggests it for)
AREAL_KEYS = {
    "rollout.max_head_offpolicyness": (
        MAIN,
        "how many versions a rollout may lag the trainer; 0 is synchronous RL",
    ),
    "rollout.max_concurrent_rollouts": (MAIN, "rollouts in flight at once"),
    "rollout.consumer_batch_size": (MAIN, "rollouts the trainer takes per step"),
    "rollout.enable_rollout_tracing": (MAIN, "log each rollout's submit/accept/reject"),
    "actor.weight_update_mode": (MAIN, "how weights reach the servers: xccl, disk or awex"),
    "actor.backend": (MAIN, "backend and parallelism, e.g. fsdp:d4 (d: the SPMD capacity divisor)"),
    "sglang.mem_fraction_static": (MAIN, "GPU memory share of SGLang's KV cache pool"),
    "vllm.gpu_memory_utilization": (MAIN, "GPU memory share of vLLM's KV cache"),
    "perf_tracer.enabled": (MAIN, "write Chrome-trace spans per rank (perf_tracer/)"),
    "perf_tracer.session_tracer.enabled": (MAIN, "write session traces (session_tracer/)"),
    "rollout.dump_to_file": (MAIN, "write text rollouts to <log dir>/rollout/<version>/"),
    "actor.rejection_sampling": (
        MAIN,
        "drop or clamp tokens whose pi_prox/pi_behave leaves [lower, upper] "
        "(replaces the removed behave_imp_weight_cap)",
    ),
    "actor.rejection_sampling.level": (MAIN, "token or sequence"),
    "actor.rejection_sampling.action": (MAIN, "mask (drop) or clamp"),
    "actor.rejection_sampling.metric": (MAIN, "ratio, kl_k1, kl_k2, kl_k3 or binary_kl"),
    "actor.rejection_sampling.upper": (MAIN, "upper bound of the metric"),
    "actor.rejection_sampling.lower": (MAIN, "lower bound of the metric"),
    "actor.use_decoupled_loss": (MAIN, "decoupled PPO: weight by pi_prox/pi_behave"),
    "actor.recompute_logprob": (MAIN, "recompute log-probabilities before the update"),
    "actor.eps_clip": (MAIN, "PPO clipping of pi_theta/pi_prox"),
    "actor.ppo_n_minibatches": (MAIN, "minibatches per PPO update"),
    "actor.optimizer.lr": (MAIN, "learning rate"),
    "actor.optimizer.gradient_clipping": (MAIN, "gradient norm clipping"),
    "actor.mask_no_eos_with_zero": (MAIN, "zero the reward of sequences cut without EOS"),
    "gconfig.max_new_tokens": (MAIN, "the generation length limit"),
    "gconfig.n_samples": (MAIN, "completions per prompt (the GRPO group size)"),
    "gconfig.temperature": (MAIN, "sampling temperature"),
    "gconfig.stop_token_ids": (MAIN, "token ids that end a generation"),
    "train_dataset.batch_size": (MAIN, "prompts per step"),
    "total_train_steps": (MAIN, "stop after this many global steps"),
    "tokenizer_path": (MAIN, "the tokenizer (and its EOS id)"),
    "actor.path": (MAIN, "the model (and its generation_config.json)"),
    "stats_logger.tensorboard.path": (MAIN, "write tensorboard events"),
    "trajectory_debug.dump_rollout_data": (PR_1407, "save each step's batch as step_NNNNNN.pt"),
    "trajectory_debug.replay_rollout_data": (PR_1407, "train on the saved batches instead"),
    "trajectory_debug.path": (PR_1407, "the dump directory"),
    "trajectory_debug.dump_steps": (PR_1407, "only these global steps"),
    "trajectory_debug.max_keep": (PR_1407, "keep the newest N dumped steps"),
    "trajectory_debug.pin_steps": (PR_1407, "steps never rotated away"),
    "trajectory_debug.dump_scope": (PR_1407, "rollout, or full (after ref/critic/teacher)"),
}


def config_key(name: str) -> str:
    """`name`, after checking that the registry knows it (a typo fails loudly in tests)."""
    if name not in AREAL_KEYS:
        raise KeyError("not a registered AReaL config key: " + name)
    return name


def rejection_sampling_example(upper: float) -> str:
    """The override that restores AReaL's old default filter (cli_args.py:1941-1952)."""
    key = config_key("actor.rejection_sampling")
    return (
        key
        + ".level=token "
        + key
        + ".action=mask "
        + key
        + ".metric=ratio "
        + key
        + ".upper="
        + format(upper, "g")
    )


# Keys of the console's own reference trainer that AReaL does not have (documented as such).
REFERENCE_TRAINER_KEYS = ("trajectory_debug.save_checkpoints",)
