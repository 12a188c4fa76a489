"""The dump variants AReaL writes, read as AReaL's actor reads them.

Fixtures are built with AReaL's own functions (tests/support/fixtures/areal_code.py, transcribed and
checked against AReaL's source in tests/unit/test_areal_code.py) and saved with `torch.save`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from areal_node import batches as b
from areal_node.batches import BatchError

from tests.support.fixtures import areal_code as ac
from tests.support.fixtures import batch_dumps as bf


def _gen(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_on_policy_dump_has_behave_imp_weight_one_and_no_alarm(tmp_path: Path) -> None:
    """prox_logp is next-token aligned; compared as AReaL does, pi_prox/pi_behave is 1."""
    gen = _gen()
    groups = [bf.on_policy_group(gen) for _ in range(4)]
    path = bf.write_step(tmp_path, 0, groups, dp_rank=0)
    s = b.summarize(str(path), eos_token_id=bf.EOS_TOKEN_ID)
    iw = s["stats"]["behave_imp_weight"]
    assert iw["mean"] == pytest.approx(1.0, abs=1e-6) and iw["max"] == pytest.approx(1.0)
    assert iw["tokens"] == sum(int(g["loss_mask"].sum()) for g in groups)
    assert not any("behave_imp_weight" in w for w in s["warnings"])
    # Read token-aligned (the mistake), the same file would look badly off-policy.
    naive = torch.cat(
        [torch.exp(g["prox_logp"] - g["logprobs"])[g["loss_mask"].bool()] for g in groups]
    )
    assert abs(float(naive.mean()) - 1.0) > 0.5


def test_teacher_floats_beside_tensors(tmp_path: Path) -> None:
    gen = _gen(1)
    groups = [bf.teacher_group(gen, rl_loss_weight=1.0, distill_loss_weight=0.5) for _ in range(3)]
    path = bf.write_step(tmp_path, 3, groups, dp_rank=1)
    s = b.json_safe(b.summarize(str(path)))
    assert s["format"] == b.TRAJECTORY and s["samples"] == 12
    keys = s["keys"]
    assert keys["rl_loss_weight"]["dtype"] == "float" and keys["rl_loss_weight"]["value"] == 1.0
    assert keys["distill_loss_weight"]["value"] == 0.5
    assert keys["teacher_logp"]["dtype"] == "float32" and len(keys["teacher_logp"]["shape"]) == 2
    v = b.sample_view(str(path), 5)
    assert v["extras"] == {"rl_loss_weight": 1.0, "distill_loss_weight": 0.5}
    assert v["teacher_logp"] is not None and len(v["teacher_logp"]) == v["seq_len"]
    json.dumps(s, allow_nan=False)


def test_vision_batch_with_multi_modal_input(tmp_path: Path) -> None:
    gen = _gen(2)
    groups = [bf.vision_group(gen), bf.vision_group(gen)]
    path = bf.write_step(tmp_path, 1, groups)
    s = b.summarize(str(path), eos_token_id=bf.EOS_TOKEN_ID)
    mm = s["keys"]["multi_modal_input"]
    assert mm["kind"] == "list" and mm["shape"] == [6]  # one dict per sample
    assert mm["fields"]["pixel_values"]["dtype"] == "float32"
    assert mm["fields"]["image_grid_thw"]["shape"] == [1, 3]
    assert s["keys"]["input_ids"]["dtype"] == "int64"
    assert s["stats"]["no_eos_token_ratio"] == 0.0
    v = b.sample_view(str(path), 4)  # group 1, row 1
    assert v["group"] == 1 and v["row"] == 1
    assert v["extras"]["multi_modal_input"]["pixel_values"]["shape"] == [20, 1176]


def test_agent_rewards_task_reward_and_task_ids(tmp_path: Path) -> None:
    """task_reward is original_rewards when present (normalised rewards average 0)."""
    gen = _gen(3)
    groups = [bf.agent_group(gen, task_id=f"task-{i}") for i in range(3)]
    path = bf.write_step(tmp_path, 2, groups)
    s = b.summarize(str(path))
    assert s["keys"]["task_id"]["dtype"] == "str" and s["keys"]["task_id"].get("values_differ")
    st = s["stats"]
    assert st["task_reward"]["mean"] == pytest.approx(0.25)
    assert st["task_reward"]["max"] == 1.0 and st["task_reward"]["min"] == 0.0
    assert st["reward"]["mean"] == pytest.approx(0.0, abs=1e-6)  # group-normalised
    table = b.sample_table(str(path))["rows"]
    assert [r["task_reward"] for r in table[:4]] == [1.0, 0.0, 0.0, 0.0]
    assert b.sample_view(str(path), 9)["extras"]["task_id"] == "task-2"


def test_no_eos_ratio_is_areals_padded_width_rule(tmp_path: Path) -> None:
    """seqlen == the padded width of the rank's batch (areal/trainer/ppo/actor.py:419), no EOS id needed."""
    gen = _gen(4)
    groups = [
        bf.on_policy_group(gen, max_new_tokens=24),
        bf.on_policy_group(gen, max_new_tokens=10),
    ]
    path = bf.write_step(tmp_path, 0, groups, dp_rank=0)
    batch = ac.concat_padded_tensors(groups)  # what _ppo_update sees
    seqlens = batch["attention_mask"].sum(-1)
    expected = float((seqlens == batch["attention_mask"].shape[-1]).float().mean())
    s = b.summarize(str(path))
    assert s["eos_token_ids"] is None
    assert s["stats"]["no_eos_ratio"] == pytest.approx(expected) and expected > 0
    # The second group's truncated sample is shorter than the batch: AReaL does not count it.
    assert s["stats"]["no_eos_ratio"] == pytest.approx(1 / 8)
    assert s["stats"]["no_eos_token_ratio"] is None
    assert not any("EOS" in w for w in s["warnings"])
    with_eos = b.summarize(str(path), eos_token_id=bf.EOS_TOKEN_ID)
    assert with_eos["stats"]["no_eos_token_ratio"] == pytest.approx(2 / 8)
    assert with_eos["stats"]["no_eos_ratio"] == s["stats"]["no_eos_ratio"]


def test_eos_id_from_the_experiments_config_yaml(tmp_path: Path) -> None:
    """Default dump dir <fileroot>/<exp>/<trial>/debug_trajectories; config in the log dir."""
    model = tmp_path / "models" / "qwen"
    bf.write_model_config(model, eos_token_id=[151645, 151643])
    log_dir = tmp_path / "fileroot" / "logs" / "alice" / "gsm8k" / "trial0"
    log_dir.mkdir(parents=True)
    (log_dir / "config.yaml").write_text(
        f"experiment_name: gsm8k\ntrial_name: trial0\ntokenizer_path: {model}\n"
        f"actor:\n  experiment_name: gsm8k\n  path: '{model}'\n  optimizer:\n    lr: 1.0e-06\n"
    )
    dumps = tmp_path / "fileroot" / "gsm8k" / "trial0" / "debug_trajectories"
    path = bf.write_step(dumps, 0, [bf.on_policy_group(_gen(5))])
    ids, source = b.find_eos_token_ids(str(path))
    assert ids == [151645, 151643]
    assert source is not None and str(log_dir / "config.yaml") in source


def test_dict_batch_with_non_tensor_entries(tmp_path: Path) -> None:
    """The actor's batched dict (concat_batch) of teacher groups: floats kept once."""
    gen = _gen(6)
    batch = ac.concat_padded_tensors(
        [bf.teacher_group(gen, rl_loss_weight=0.8, distill_loss_weight=0.2) for _ in range(2)]
    )
    assert batch["rl_loss_weight"] == 0.8
    path = tmp_path / "batch.pt"
    torch.save(batch, path)
    s = b.summarize(str(path))
    assert s["format"] == b.DICT_BATCH and s["samples"] == 8
    assert s["keys"]["rl_loss_weight"]["value"] == 0.8


@pytest.fixture(scope="module")
def sc_dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sc")
    gen = _gen(8)
    groups = [bf.teacher_group(gen, rl_loss_weight=1.0, distill_loss_weight=0.5) for _ in range(4)]
    bf.write_single_controller_step(d, 0, groups, ["10.0.0.5:41231", "10.0.0.6:41231"])
    return d / "step_000000.pt"


def test_single_controller_rtensor_references(sc_dump: Path) -> None:
    s = b.json_safe(b.summarize(str(sc_dump)))
    assert s["format"] == b.TRAJECTORY_REFS and s["groups"] == 4 and s["samples"] == 16
    assert (
        s["keys"]["input_ids"]["kind"] == "rtensor" and s["keys"]["input_ids"]["dtype"] == "int32"
    )
    assert s["keys"]["rl_loss_weight"]["value"] == 1.0
    assert s["remote"]["nodes"] == {"10.0.0.5:41231": 18, "10.0.0.6:41231": 18}
    (w,) = s["warnings"]
    assert "RTensor references" in w and "RTensor.localize(batch)" in w
    assert "10.0.0.5:41231" in w and "clear_batches" in w
    with pytest.raises(BatchError, match="holds AReaL RTensor references"):
        b.sample_view(str(sc_dump), 0)
    with pytest.raises(BatchError, match="holds AReaL RTensor references"):
        b.sample_table(str(sc_dump))
    d = b.summarize(str(sc_dump.parent))
    assert "RTensor references" in " ".join(d["warnings"])


def test_rtensor_file_is_refused_by_plain_weights_only_load(sc_dump: Path) -> None:
    """What torch itself says about such a file (a fresh process: no stand-ins registered)."""
    code = textwrap.dedent(
        f"""
        import torch
        try:
            torch.load({str(sc_dump)!r}, weights_only=True)
        except Exception as exc:
            print(type(exc).__name__, exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "UnpicklingError" in out.stdout
    assert "Unsupported global: GLOBAL areal.infra.rpc.rtensor.RTensor" in out.stdout


def test_trusted_rtensor_file_without_areal_installed(sc_dump: Path) -> None:
    """--trust-pickle never runs AReaL's code unless it is installed; here it is not."""
    s = b.summarize(str(sc_dump), trust_pickle=True)
    assert s["format"] == b.TRAJECTORY_REFS  # the safe loader read it; nothing else ran


def test_reference_trainer_full_dump_reads_as_on_policy(tmp_path: Path) -> None:
    """The reference trainer stores prox_logp as AReaL's compute_logp returns it; with
    on-policy rollouts (rollout.max_head_offpolicyness=0) pi_prox/pi_behave is 1."""
    from areal_console.core.replay.plan import local_trainer

    dump = tmp_path / "dump"
    argv, env = local_trainer(
        "steps=2",
        "rollout.max_head_offpolicyness=0",
        "trajectory_debug.dump_rollout_data=true",
        "trajectory_debug.dump_scope=full",
        f"trajectory_debug.path={dump}",
        f"output_dir={tmp_path / 'out'}",
    )
    proc = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    s = b.summarize(str(dump / "step_000001.pt"))
    iw = s["stats"]["behave_imp_weight"]
    assert iw["mean"] == pytest.approx(1.0, abs=1e-4) and iw["max"] < 1.001
    assert not any("behave_imp_weight" in w for w in s["warnings"])
    # AReaL's no_eos_ratio, as the trainer logged it for that step.
    logged = json.loads((dump / "metrics.jsonl").read_text().splitlines()[1])
    assert logged["step"] == 1 and s["stats"]["no_eos_ratio"] == pytest.approx(
        logged["no_eos_ratio"]
    )
