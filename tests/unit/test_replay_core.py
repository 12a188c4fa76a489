"""Pure replay logic: step ranges, GPU choice, plans from templates, verification."""

from __future__ import annotations

from pathlib import Path

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.replay.plan import (
    METRIC_NAMES,
    DumpIndex,
    load_templates,
    parse_gpus,
    parse_metrics,
    parse_step_range,
    plan_replay,
    verify,
)

GPU_SAMPLE = {
    "gpus": [{"index": i} for i in range(4)],
    "processes": [{"pid": 10, "gpus": [1]}],
    "gpu_error": None,
}
NO_GPU_SAMPLE = {"gpus": [], "processes": [], "gpu_error": "NVML unavailable: no driver"}


def index(
    steps: dict[int, list[int | None]], ckpts: list[int] | None = None, areal: bool = False
) -> DumpIndex:
    return DumpIndex(
        path="/data/dumps/run 1",
        steps=steps,
        checkpoints=ckpts or [],
        meta={} if areal else {"trainer": "areal-console reference trainer"},
    )


def test_metric_names_and_dump_names_come_from_one_place() -> None:
    """METRIC_NAMES and the dump-name pattern are defined once, in the node package's
    constants: the console, the batch reader and the reference trainer import them."""
    from areal_node import constants
    from areal_node.batches import parse_step_name
    from areal_node.batches import summary as batch_summary
    from areal_node.trainer import layout

    assert METRIC_NAMES is constants.METRIC_NAMES
    assert "grad_norm" in METRIC_NAMES
    assert batch_summary.DUMP_FILE is constants.DUMP_FILE
    assert layout.DUMP_FILE is constants.DUMP_FILE
    # AReaL writes f"step_{step:06d}.pt" and f"step_{step:06d}_dp_{dp_rank}.pt".
    assert parse_step_name(f"step_{12:06d}.pt") == (12, None)
    assert parse_step_name(f"step_{12:06d}_dp_{3}.pt") == (12, 3)
    assert parse_step_name(f"step_{1234567:06d}_dp_{0}.pt") == (1234567, 0)
    assert parse_step_name(constants.dump_name(12, 3)) == (12, 3)
    assert parse_step_name(constants.dump_name(12, None)) == (12, None)
    for other in ("step_12.pt", "step_000012_dp_.pt", "step_000012.pt.tmp", "xstep_000012.pt"):
        assert parse_step_name(other) is None, other


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2:5", (2, 5)),
        ("3", (3, 3)),
        (":4", (None, 4)),
        ("2:", (2, None)),
        ("0:3", (0, 3)),  # AReaL's global steps start at 0
        (None, (None, None)),
    ],
)
def test_step_ranges(text: str | None, expected: tuple[int | None, int | None]) -> None:
    assert parse_step_range(text) == expected


@pytest.mark.parametrize("text", ["5:2", "a:b", "-1:3"])
def test_bad_step_ranges(text: str) -> None:
    with pytest.raises(UserError, match="bad step range"):
        parse_step_range(text)


def test_gpu_lists() -> None:
    assert parse_gpus("0, 2") == [0, 2]
    assert parse_gpus("cpu") == []
    assert parse_gpus(None) is None
    with pytest.raises(UserError, match="twice"):
        parse_gpus("1,1")
    with pytest.raises(UserError, match="bad GPU list"):
        parse_gpus("0;rm -rf /")


def test_plan_picks_free_gpus_and_keeps_file_names_as_single_arguments() -> None:
    templates = load_templates()
    plan = plan_replay(
        index({0: [0, 1], 1: [0, 1]}),
        "node1",
        GPU_SAMPLE,
        templates["reference"],
        script="/opt/t.py",
        overrides=["actor.eps_clip=0.1"],
    )
    assert plan.gpus == [0, 2]  # GPU 1 is busy
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,2"}
    assert plan.steps == (0, 1) and plan.nproc == 2
    assert "start_step=0" in plan.argv and "steps=2" in plan.argv  # global steps 0 and 1
    assert "trajectory_debug.path=/data/dumps/run 1" in plan.argv  # one element, spaces kept
    assert plan.argv[-1] == "actor.eps_clip=0.1"


def test_areal_template_from_the_guide() -> None:
    plan = plan_replay(
        index({0: [None], 1: [None], 2: [None], 5: [None]}, areal=True),
        "n",
        NO_GPU_SAMPLE,
        load_templates()["areal"],
        script="examples/math/gsm8k_rl.py",
        config="gsm8k.yaml",
    )
    assert plan.argv == [
        "python3",
        "examples/math/gsm8k_rl.py",
        "--config",
        "gsm8k.yaml",
        "trajectory_debug.replay_rollout_data=true",
        "trajectory_debug.path=/data/dumps/run 1",
        # AReaL's replay runs from global step 0 until total_train_steps; steps 0-2 are
        # dumped without a gap, so it stops after step 2.
        "total_train_steps=3",
    ]
    assert plan.gpus == [] and plan.metrics is None and plan.steps == (0, 2)


def test_areal_template_offers_no_start_step() -> None:
    areal = load_templates()["areal"]
    dump = index({0: [None], 1: [None]}, areal=True)
    with pytest.raises(UserError, match="has no start-step option"):
        plan_replay(dump, "n", NO_GPU_SAMPLE, areal, script="s.py", config="c.yaml", first=1)
    with pytest.raises(UserError, match=r"starts at global step 0 .* has no step 0"):
        plan_replay(
            index({3: [None], 4: [None]}, areal=True),
            "n",
            NO_GPU_SAMPLE,
            areal,
            script="s.py",
            config="c.yaml",
        )
    mine = plan_replay(
        dump, "n", NO_GPU_SAMPLE, areal, script="s.py", config="c.yaml",
        overrides=["total_train_steps=1"],
    )  # fmt: skip
    assert [a for a in mine.argv if a.startswith("total_train_steps")] == ["total_train_steps=1"]


def test_templates_from_config_and_unknown_placeholders() -> None:
    templates = load_templates({"mine": "torchrun {script} x={dir}"})
    assert templates["mine"].argv == ("torchrun", "{script}", "x={dir}")
    with pytest.raises(UserError, match="unknown placeholder"):
        load_templates({"bad": "python {__class__}"})


def test_missing_step_lists_available_steps() -> None:
    with pytest.raises(UserError, match=r"no dump for step 4 .* available steps: 1-3,5"):
        plan_replay(
            index({1: [None], 2: [None], 3: [None], 5: [None]}),
            "n",
            NO_GPU_SAMPLE,
            load_templates()["reference"],
            script="t.py",
            first=2,
            last=5,
        )


def test_later_start_needs_a_checkpoint() -> None:
    dump = index({1: [None], 2: [None], 3: [None]}, ckpts=[1, 3])
    with pytest.raises(UserError, match="no checkpoint"):
        plan_replay(dump, "n", NO_GPU_SAMPLE, load_templates()["reference"], script="t", first=2)
    plan = plan_replay(dump, "n", NO_GPU_SAMPLE, load_templates()["reference"], script="t", first=3)
    assert plan.steps == (3, 3)


def test_dp_size_must_match_the_chosen_gpus() -> None:
    with pytest.raises(UserError, match=r"made with 2 data-parallel rank\(s\), but 1 GPU"):
        plan_replay(
            index({0: [0, 1]}), "n", GPU_SAMPLE, load_templates()["reference"], script="t", gpus=[0]
        )


def test_gpu_indices_the_node_lacks() -> None:
    with pytest.raises(UserError, match=r"node n has no GPU 7 \(it has 0,1,2,3\)"):
        plan_replay(
            index({0: [None]}), "n", GPU_SAMPLE, load_templates()["reference"], script="t", gpus=[7]
        )
    with pytest.raises(UserError, match=r"has no GPUs .*NVML unavailable.*--gpus cpu"):
        plan_replay(
            index({0: [None]}),
            "n",
            NO_GPU_SAMPLE,
            load_templates()["reference"],
            script="t",
            gpus=[0],
        )


def test_dump_flag_in_replay_overrides_is_refused() -> None:
    with pytest.raises(UserError, match="mutually exclusive"):
        plan_replay(
            index({1: [None]}),
            "n",
            NO_GPU_SAMPLE,
            load_templates()["reference"],
            script="t",
            overrides=["trajectory_debug.dump_rollout_data=true"],
        )


def metrics_line(step: int, loss: float) -> str:
    values = dict.fromkeys(METRIC_NAMES, 0.5)
    values["actor_loss"] = loss
    import json

    return json.dumps({"step": step, **values})


def test_verify_reports_first_differing_step_and_metric() -> None:
    recorded = parse_metrics("\n".join(metrics_line(s, 0.1 * s) for s in (1, 2, 3)))
    same = parse_metrics("\n".join(metrics_line(s, 0.1 * s) for s in (2, 3)) + "\n{torn")
    assert verify(recorded, same, (2, 3)).matched
    off = parse_metrics("\n".join(metrics_line(s, 0.1 * s + (s == 3) * 1e-12) for s in (2, 3)))
    result = verify(recorded, off, (2, 3))
    assert not result.matched and result.steps == [2]
    assert result.first_mismatch == {
        "step": 3,
        "metric": "actor_loss",
        "recorded": 0.30000000000000004,
        "replayed": 0.30000000000100005,
    }
    assert "step 3: actor_loss" in result.summary
    missing = verify(recorded, same, (2, 4))
    assert not missing.matched and "missing" in missing.summary


def test_areal_template_may_use_more_gpus_than_dp_ranks() -> None:
    dump = index({0: [0, 1]}, areal=True)
    areal = load_templates()["areal"]
    plan = plan_replay(dump, "n", GPU_SAMPLE, areal, script="s.py", config="c.yaml", gpus=[0, 2, 3])
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,2,3"}
    with pytest.raises(UserError, match="pick 2 or more"):
        plan_replay(dump, "n", GPU_SAMPLE, areal, script="s.py", config="c.yaml", gpus=[0])


def test_replay_core_does_not_import_textual() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tui"), str(root / "agents")])}

    code = (
        "import sys, areal_console.core.replay.plan, areal_console.core.replay.runs;"
        "sys.exit('textual' in sys.modules or 'torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_trainer_config_file_and_dotted_overrides(tmp_path: Path) -> None:
    from areal_node.trainer import config as rt

    config_file = tmp_path / "exp.yaml"
    config_file.write_text(
        "steps: 6  # short run\n"
        "actor:\n"
        "  eps_clip: 0.1\n"
        "trajectory_debug:\n"
        "  dump_rollout_data: true\n"
        "  path: /tmp/d\n"
        "  dump_steps: [2, 4]\n"
    )
    config = rt.load_config(str(config_file), ["steps=8", "actor.optimizer.lr=0.001"])
    assert config["steps"] == 8 and config["actor"]["eps_clip"] == 0.1
    assert config["actor"]["optimizer"]["lr"] == 0.001
    assert config["trajectory_debug"]["dump_steps"] == [2, 4]
    # AReaL's names: the filter is actor.rejection_sampling, off-policyness under rollout.
    assert config["actor"]["rejection_sampling"]["upper"] == 5.0
    assert config["rollout"]["max_head_offpolicyness"] == 1
    off = rt.load_config(None, ["actor.rejection_sampling=null"])
    assert off["actor"]["rejection_sampling"] is None
    with pytest.raises(rt.ConfigError, match=r"unknown config key 'actor\.behav_imp_weight_cap'"):
        rt.load_config(None, ["actor.behav_imp_weight_cap=2"])
    with pytest.raises(rt.ConfigError, match="level=token, metric=ratio"):
        rt.load_config(None, ["actor.rejection_sampling.metric=kl_k3"])
    with pytest.raises(rt.ConfigError, match=r"unknown config key 'actor\.epsilon'"):
        rt.load_config(None, ["actor.epsilon=0.3"])
    with pytest.raises(rt.ConfigError, match="max_keep must be a positive integer"):
        rt.load_config(None, ["trajectory_debug.max_keep=0"])
    with pytest.raises(rt.ConfigError, match="start_step > 0 needs"):
        rt.load_config(None, ["start_step=3", "steps=5"])
    with pytest.raises(rt.ConfigError, match="global steps start at 0"):
        rt.load_config(None, ["start_step=5", "steps=5"])


def test_cross_device_replay_is_compared_within_a_stated_tolerance() -> None:
    """The numbers from a CUDA recording replayed on CPU: not bit for bit, and that is
    expected; a real divergence still fails."""
    recorded = {1: {"importance_weight": 0.99213773554}}
    on_cpu = {1: {"importance_weight": 0.99213769219}}
    exact = verify(recorded, on_cpu, (1, 1), metrics=("importance_weight",))
    assert not exact.matched and "bit for bit" in exact.summary
    close = verify(recorded, on_cpu, (1, 1), metrics=("importance_weight",), rel_tol=1e-3)
    assert close.matched and close.comparable
    assert "within relative tolerance 0.001, cross-device" in close.summary
    wrong = verify(recorded, {1: {"importance_weight": 0.95}}, (1, 1),
                   metrics=("importance_weight",), rel_tol=1e-3)  # fmt: skip
    assert not wrong.matched and "differs" in wrong.summary
    gone = verify({}, on_cpu, (1, 1), metrics=("importance_weight",))
    assert not gone.comparable and gone.summary.startswith("cannot compare")


def test_plan_says_which_device_recorded_and_which_replays() -> None:
    template = load_templates()["reference"]
    cuda_recording = index({0: [None]})
    cuda_recording.meta["device"] = "cuda"
    on_cpu = plan_replay(cuda_recording, "n", NO_GPU_SAMPLE, template, gpus=[], script="t.py")
    assert (on_cpu.recorded_device, on_cpu.device, on_cpu.tolerance) == ("cuda", "cpu", 1e-3)
    assert on_cpu.device_note.startswith("recorded on cuda, replaying on cpu: cross-device")
    on_gpu = plan_replay(cuda_recording, "n", GPU_SAMPLE, template, gpus=[0], script="t.py")
    assert on_gpu.tolerance is None and on_gpu.device_note.endswith("bit for bit")
    unknown = plan_replay(index({0: [None]}), "n", NO_GPU_SAMPLE, template, gpus=[], script="t")
    assert unknown.tolerance is None and "does not say its device" in unknown.device_note
    assert on_cpu.to_json()["tolerance"] == 1e-3
