"""Batch reader, stats and health checks on real `torch.save` files in AReaL's layout."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from areal_node import batches as b
from areal_node.batches import BatchError, UnsafePickleError

from tests.support.fixtures import batch_dumps as bf


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four steps x two dp ranks, completions growing step by step, EOS id in a config file."""
    d = tmp_path_factory.mktemp("dump")
    bf.write_trajectory_dump(
        d,
        steps=[0, 1, 2, 3],
        dp_size=2,
        with_prox_logp=True,
        length_growth=0.3,
        no_eos_fraction=0.15,
    )
    bf.write_model_config(d)
    return d


@pytest.fixture(scope="module")
def step_file(dump_dir: Path) -> Path:
    return dump_dir / "step_000001_dp_0.pt"


class Payload:
    """Unpickling this would create a marker file: the proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


# --------------------------------------------------------------------------------------
# Fixtures match AReaL's layout


def test_fixture_files_have_areal_layout(dump_dir: Path) -> None:
    names = sorted(p.name for p in dump_dir.glob("*.pt"))
    assert names[:2] == ["step_000000_dp_0.pt", "step_000000_dp_1.pt"]
    assert len(names) == 8
    groups = torch.load(dump_dir / names[0], weights_only=True)
    assert isinstance(groups, list) and all(isinstance(g, dict) for g in groups)
    g = groups[1]
    n, width = g["input_ids"].shape
    assert g["input_ids"].dtype == torch.int32 and g["loss_mask"].dtype == torch.int32
    assert g["logprobs"].dtype == torch.float32 and g["attention_mask"].dtype == torch.bool
    assert g["rewards"].shape == (n,) and g["rewards"].dtype == torch.float32
    seq = g["attention_mask"].sum(-1)
    assert int(seq.max()) == width  # the group's longest sample sets its width
    for r in range(n):
        s = int(seq[r])
        assert not g["attention_mask"][r, s:].any()  # right padding
        prompt = g["loss_mask"][r] == 0
        assert (g["versions"][r][prompt & g["attention_mask"][r]] == -1).all()
        assert (g["versions"][r][g["loss_mask"][r] == 1] >= 0).all()
    # One shared prompt per group (GRPO).
    plen = int((g["loss_mask"][0] == 0).sum() - (~g["attention_mask"][0]).sum())
    assert torch.equal(g["input_ids"][0, :plen], g["input_ids"][1, :plen])


# --------------------------------------------------------------------------------------
# Summaries


def test_summary_of_a_step_file(step_file: Path) -> None:
    s = b.json_safe(b.summarize(str(step_file)))
    assert s["format"] == b.TRAJECTORY and s["step"] == 1 and s["dp_rank"] == 0
    assert s["groups"] == 8 and s["samples"] == 64
    assert s["keys"]["input_ids"]["dtype"] == "int32" and s["keys"]["rewards"]["shape"] == [64]
    st = s["stats"]
    groups = torch.load(step_file, weights_only=True)
    seq = torch.cat([g["attention_mask"].sum(-1) for g in groups]).double()
    resp = torch.cat([g["loss_mask"].sum(-1) for g in groups]).double()
    rewards = torch.cat([g["rewards"] for g in groups]).double()
    assert s["tokens"] == int(seq.sum())
    assert st["seq_len"]["mean"] == pytest.approx(float(seq.mean()))
    assert st["response_len"]["max"] == float(resp.max())
    assert st["prompt_len"]["mean"] == pytest.approx(float((seq - resp).mean()))
    # No original_rewards: AReaL's task_reward is the rewards themselves.
    assert st["task_reward"]["std"] == pytest.approx(float(rewards.std(unbiased=False)))
    assert st["task_reward"] == st["reward"]
    # EOS id 2 from generation_config.json next to the dump.
    assert s["eos_token_ids"] == [2] and s["eos_source"].endswith("generation_config.json")
    last = [
        int(g["input_ids"][r, int(g["attention_mask"][r].sum()) - 1])
        for g in groups
        for r in range(g["input_ids"].shape[0])
    ]
    assert st["no_eos_token_ratio"] == pytest.approx(sum(t != 2 for t in last) / len(last))
    # AReaL's no_eos_ratio: sequences as long as the rank's padded batch.
    width = max(g["attention_mask"].shape[1] for g in groups)
    assert st["no_eos_ratio"] == pytest.approx(float((seq == width).double().mean()))
    assert 0 < st["no_eos_ratio"] < st["no_eos_token_ratio"]
    equal = sum(int(g["rewards"].max() == g["rewards"].min()) for g in groups)
    assert st["equal_reward_groups"] == equal == 2
    iw = st["behave_imp_weight"]
    assert iw["mean"] == pytest.approx(1.0, abs=0.01) and iw["sampled"] is False
    assert "importance_weight" not in st  # pi_theta/pi_prox: not in a dump
    assert st["version"]["max"] == 1 and st["version"]["staleness_max"] <= 2
    json.dumps(s, allow_nan=False)


def test_eos_flag_overrides_config_and_warns(step_file: Path) -> None:
    s = b.summarize(str(step_file), eos_token_id=31999)  # never generated: all "truncated"
    assert s["stats"]["no_eos_token_ratio"] == 1.0
    assert s["stats"]["no_eos_ratio"] < 0.05  # AReaL's own figure needs no EOS id
    assert any("do not end in the EOS token" in w for w in s["warnings"])


def test_directory_timeline_and_length_growth(dump_dir: Path) -> None:
    s = b.summarize(str(dump_dir))
    assert s["format"] == b.TRAJECTORY_DIR
    assert s["steps"] == [0, 1, 2, 3] and s["dp_ranks"] == [0, 1]
    assert [(e["step"], e["dp_rank"]) for e in s["timeline"]][:3] == [(0, 0), (0, 1), (1, 0)]
    assert s["samples"] == 8 * 64
    lens = [p["response_len_mean"] for p in s["per_step"]]
    assert lens == sorted(lens)
    assert any(w.startswith("response length grows between steps") for w in s["warnings"])


def test_dict_batch_groups_rows_by_prompt(tmp_path: Path) -> None:
    path = bf.write_dict_batch(tmp_path / "batch.pt", n_groups=4, group_size=4)
    s = b.summarize(str(path), eos_token_id=2)
    assert s["format"] == b.DICT_BATCH and s["samples"] == 16 and s["groups"] == 4
    assert s["stats"]["equal_reward_groups"] == 1


def test_text_rollout_dump(tmp_path: Path) -> None:
    bf.write_text_rollout_dump(tmp_path, versions=(1, 2), tasks=3, samples_per_task=4)
    s = b.summarize(str(tmp_path))
    assert s["format"] == b.TEXT_ROLLOUT and s["samples"] == 24 and s["groups"] == 6
    assert s["versions"] == [1, 2]
    view = b.sample_view(str(tmp_path), 5)
    assert view["prompt"].startswith("Question 1 at version 1")
    assert view["response_len"] == view["seq_len"] - view["prompt_len"]


def test_sample_view_unpads_one_sample(step_file: Path) -> None:
    table = b.sample_table(str(step_file))
    row = table["rows"][10]
    v = b.sample_view(str(step_file), 10)
    groups = torch.load(step_file, weights_only=True)
    g = groups[row["group"]]
    n = row["seq_len"]
    assert v["tokens"] == g["input_ids"][row["row"], :n].tolist()
    assert len(v["loss_mask"]) == len(v["logprobs"]) == len(v["versions"]) == n
    assert sum(v["loss_mask"]) == v["response_len"]
    assert v["reward"] == float(g["rewards"][row["row"]])
    assert all(x == -1 for x, m in zip(v["versions"], v["loss_mask"], strict=True) if not m)
    with pytest.raises(BatchError, match="out of range"):
        b.sample_view(str(step_file), 64)


def test_compare_two_steps(dump_dir: Path) -> None:
    a = b.summarize(str(dump_dir / "step_000000_dp_0.pt"))
    c = b.summarize(str(dump_dir / "step_000003_dp_0.pt"))
    rows = {r["stat"]: r for r in b.compare(a, c)["rows"]}
    r = rows["response_len.mean"]
    assert r["delta"] == pytest.approx(r["b"] - r["a"]) and r["delta"] > 0


# --------------------------------------------------------------------------------------
# Pure stats and warnings


def _row(seq: int, resp: int, reward: float, eos: bool | None, head: int = 3) -> dict[str, Any]:
    return {
        "seq_len": seq,
        "prompt_len": seq - resp,
        "response_len": resp,
        "task_reward": reward,
        "reward": reward,
        "no_eos": seq == 12,  # 12: the padded width of this batch
        "eos": eos,
        "head_version": head,
        "tail_version": head,
    }


def test_batch_stats_and_thresholds() -> None:
    rows = [
        _row(10, 6, 1.0, True),
        _row(12, 8, 0.0, False, head=1),
        _row(8, 4, 1.0, True),
        _row(9, 5, 1.0, True),
    ]
    st = b.batch_stats(rows, [[1.0, 0.0], [1.0, 1.0]], None, [0, 0, 0, 1])
    assert st["no_eos_ratio"] == 0.25 and st["no_eos_token_ratio"] == 0.25
    assert st["equal_reward_group_ratio"] == 0.5
    want = {"mean": 0.75, "std": pytest.approx(0.4330127), "min": 0.0, "max": 1.0}
    assert st["task_reward"] == want
    assert st["version"]["staleness_max"] == 2 and st["version"]["mixed_version_ratio"] == 0.25
    warnings = b.batch_warnings(st)
    assert any("no_eos_ratio 0.250 > 0.05" in w for w in warnings)
    assert any(w.startswith("50% of groups have all-equal rewards") for w in warnings)
    # At the threshold no_eos does not warn (AReaL: above 0.05).
    assert not any("no_eos" in w for w in b.batch_warnings({"no_eos_ratio": 0.05}))
    far = {"behave_imp_weight": {"mean": 1.4, "min": 0.1, "max": 9.0, "above_upper_ratio": 0.01}}
    text = " ".join(b.batch_warnings(far))
    assert "behave_imp_weight mean 1.400 is far from 1.0" in text
    assert "rollout.max_head_offpolicyness" in text
    # The removed behav_imp_weight_cap is now actor.rejection_sampling (cli_args.py:1505).
    assert "actor.rejection_sampling.upper=5" in text and "imp_weight_cap" not in text


def test_length_trend_needs_steady_growth() -> None:
    flat = [
        {"step": i, "response_len_mean": 100.0 + (i % 2), "no_eos_ratio": 0.01} for i in range(5)
    ]
    assert b.length_trend_warnings(flat) == []
    growing = [
        {"step": i, "response_len_mean": 100.0 * 1.2**i, "no_eos_ratio": 0.01 * i} for i in range(4)
    ]
    (w,) = b.length_trend_warnings(growing)
    assert "no_eos_ratio 0.000 -> 0.030" in w


def test_histogram_counts_every_value() -> None:
    h = b.histogram([0.0, 0.1, 0.5, 1.0, 1.0], bins=4)
    assert h["counts"] == [2, 0, 1, 2] and len(h["edges"]) == 5
    assert b.histogram([], 4) == {"edges": [], "counts": []}


def test_eos_from_tokenizer_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|im_end|>",
                "added_tokens_decoder": {
                    "151643": {"content": "<|endoftext|>"},
                    "151645": {"content": "<|im_end|>"},
                },
            }
        )
    )
    sub = tmp_path / "dumps"
    sub.mkdir()
    ids, source = b.find_eos_token_ids(str(sub / "step_000001.pt"))
    assert ids == [151645] and source is not None and source.endswith("tokenizer_config.json")


# --------------------------------------------------------------------------------------
# Bad input


@pytest.fixture()
def small_file(tmp_path: Path) -> Path:
    path = tmp_path / "step_000007.pt"
    torch.save(bf.make_trajectory(7, n_groups=3, group_size=4), path)
    return path


def test_truncated_file(small_file: Path) -> None:
    raw = small_file.read_bytes()
    small_file.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BatchError, match="truncated or corrupt"):
        b.load_pt(str(small_file))


@pytest.mark.parametrize("seed", range(12))
def test_corrupt_archive(small_file: Path, seed: int) -> None:
    raw = bytearray(small_file.read_bytes())
    # Scribble over the pickle inside the archive (its entry comes first); garbage can trip
    # the unpickler in many ways, so several fixed scribbles.
    raw[60:400] = random.Random(seed).randbytes(340)
    small_file.write_bytes(bytes(raw))
    with pytest.raises(BatchError) as err:
        b.summarize(str(small_file))
    assert "\n" not in str(err.value) and str(small_file) in str(err.value)


def test_empty_file_and_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "step_000000.pt").write_bytes(b"")
    with pytest.raises(BatchError, match="empty file"):
        b.summarize(str(tmp_path / "step_000000.pt"))
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(BatchError, match="no rollout dumps here"):
        b.summarize(str(empty))


def test_wrong_format_is_named(tmp_path: Path) -> None:
    path = bf.write_checkpoint(tmp_path / "model.pt")
    s = b.summarize(str(path))
    assert s["format"] == b.CHECKPOINT
    assert "model checkpoint" in s["description"]
    assert "model.embed_tokens.weight" in s["description"]
    with pytest.raises(BatchError, match="not a rollout batch: a model checkpoint"):
        b.sample_table(str(path))


def test_code_running_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    path = tmp_path / "step_000001.pt"
    torch.save([{"input_ids": torch.zeros(1, 2)}, {"x": Payload(str(marker))}], path)
    with pytest.raises(UnsafePickleError, match="could run code when loaded") as err:
        b.summarize(str(path))
    assert "--trust-pickle" in str(err.value)
    assert not marker.exists()
    # Opting in really does run it: the refusal above is what protected us.
    b.load_pt(str(path), trust_pickle=True)
    assert marker.exists()


class ShellPayload:
    """What a hostile dump would hold: `os.system` on unpickling (it would create a file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_pickle_calling_os_system_is_named_not_called_corrupt(
    tmp_path: Path, zip_format: bool
) -> None:
    marker = tmp_path / "shell-ran"
    path = tmp_path / "step_000001.pt"
    torch.save([{"x": ShellPayload(str(marker))}], path,
               _use_new_zipfile_serialization=zip_format)  # fmt: skip
    with pytest.raises(UnsafePickleError) as err:
        b.summarize(str(path))
    message = str(err.value)
    assert f"(it would call {os.system.__module__}.system)" in message, message
    assert "--trust-pickle would run it" in message
    assert "corrupt" not in message and "\n" not in message
    assert not marker.exists()


def test_keys_differ_between_groups(tmp_path: Path) -> None:
    groups = bf.make_trajectory(2, n_groups=4, group_size=4, with_prox_logp=True)
    for g in groups[1:3]:
        del g["prox_logp"]
    path = tmp_path / "step_000002.pt"
    torch.save(groups, path)
    s = b.summarize(str(path), eos_token_id=2)
    assert s["keys"]["prox_logp"]["missing_in_groups"] == 2
    assert "input_ids" in s["keys"] and "missing_in_groups" not in s["keys"]["input_ids"]
    assert any("'prox_logp' is missing in 2 group(s)" in w for w in s["warnings"])
    assert s["stats"]["behave_imp_weight"]["tokens"] > 0  # from the groups that have it


def test_unreadable_file_in_a_directory_is_reported_not_fatal(tmp_path: Path) -> None:
    bf.write_trajectory_dump(tmp_path, steps=[0, 1], n_groups=2, group_size=2)
    (tmp_path / "step_000002.pt").write_bytes(b"PK\x03\x04 broken")
    s = b.summarize(str(tmp_path), eos_token_id=2)
    assert s["steps"] == [0, 1, 2] and s["samples"] == 8
    bad = [e for e in s["timeline"] if e.get("error")]
    assert [e["file"] for e in bad] == ["step_000002.pt"]


MEASURE = textwrap.dedent("""
    import json, sys, time
    import torch
    from areal_node import batches

    def peak_kb():
        # VmHWM belongs to this process image; ru_maxrss would carry the parent's over exec.
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    def read_bytes():
        # rchar: bytes this process read with read()/pread(), page cache or not.
        for line in open("/proc/self/io"):
            if line.startswith("rchar:"):
                return int(line.split()[1])

    mode, path, warm_up = sys.argv[1], sys.argv[2], sys.argv[3]
    # One pass over a small file first: lazy imports and allocator arenas are a fixed cost,
    # not something that grows with the file.
    batches.summarize(warm_up, eos_token_id=2)
    before, read_before = peak_kb(), read_bytes()
    t0 = time.perf_counter()
    if mode == "summary":
        batches.summarize(path, eos_token_id=2)
    else:
        groups = torch.load(path, weights_only=True)
        sum(float(g["attention_mask"].sum()) for g in groups)
    seconds = time.perf_counter() - t0
    after = peak_kb()
    print(json.dumps({"grew_kb": after - before, "seconds": seconds,
                      "read_kb": (read_bytes() - read_before) // 1024}))
""")


@pytest.mark.slow
def test_big_file_is_not_read_in_full(tmp_path: Path) -> None:
    path = bf.write_large_trajectory(tmp_path / "step_000001.pt", 160 << 20, width=8192)
    warm_up = bf.write_large_trajectory(tmp_path / "step_000000.pt", 1 << 20, width=8192)
    size_kb = path.stat().st_size // 1024
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def measure(mode: str) -> dict[str, float]:
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, mode, str(path), str(warm_up)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return json.loads(out.stdout)

    summary = measure("summary")
    full = measure("full")
    # A full load reads and holds the whole file; the summary reads the two masks (5 of
    # the 25 bytes per token), a few elements per sample and a bounded token sample of
    # the log-probabilities, and holds one group at a time. Pages it faulted in through
    # the mapping instead would show in its peak RSS.
    assert full["grew_kb"] > 0.9 * size_kb and full["read_kb"] > 0.9 * size_kb, full
    assert summary["read_kb"] < 0.35 * size_kb, (summary, size_kb)
    assert summary["grew_kb"] < 0.2 * size_kb, (summary, size_kb)


def _mapped_kb(path: Path) -> int:
    """Resident KB of this process's mappings of `path` (its pages faulted in)."""
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                inside = line.rstrip("\n").endswith(real)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def test_the_summary_reads_the_mapped_file_without_faulting_its_pages_in(tmp_path: Path) -> None:
    # Touching even the 16 rewards of a group through the mapping maps the pages around
    # them (64 KB of fault-around here; a whole 2 MB large page when the file sits in the
    # page cache in large units: 650 MB of a 1 GB dump's 327 groups). Every read goes
    # through the file instead, so the mapping stays empty.
    path = bf.write_large_trajectory(tmp_path / "step_000001.pt", 20 << 20, width=8192)
    obj = b.load_pt(str(path), False)
    fmt, _ = b.detect_format(obj)
    groups = b.groups_of(obj, fmt)
    assert len(groups) >= 5 and _mapped_kb(path) == 0
    result = b.analyze_groups(groups, [2], b.TOKEN_BUDGET, str(path))
    assert len(result["rows"]) == 16 * len(groups)
    assert all(r["task_reward"] is not None for r in result["rows"])
    assert _mapped_kb(path) == 0


def test_the_agent_gets_the_four_batch_ops() -> None:
    from areal_node.batches.ops import OPS

    assert set(OPS) == {"batch_summary", "batch_sample", "batch_samples", "batch_list"}


def test_the_batch_ops_run_from_the_payload_without_the_console(
    step_file: Path, tmp_path: Path
) -> None:
    """What a node's agent loads runs from the payload zip alone: no areal_console, and
    no areal_node but the zip's."""
    from areal_console.core.batches.source import EXTENSION_MODULE
    from areal_console.core.connection.payload import node_payload

    pyz = tmp_path / "payload.pyz"
    pyz.write_bytes(node_payload().data)
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["areal_console"] = None  # as on a node without the console: imports fail
        sys.path[:] = [{str(pyz)!r}] + [p for p in sys.path if "areal" not in p]
        import importlib
        ops = importlib.import_module({EXTENSION_MODULE!r}).OPS
        s = ops["batch_summary"](None, {{"path": {str(step_file)!r}, "eos_token_id": 31999}})
        import areal_node.batches
        print(areal_node.batches.__file__)
        print("|".join(s["warnings"]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(pyz) + "/areal_node/batches/")
    assert "gconfig.max_new_tokens" in out.stdout


def test_directory_analyzes_only_the_newest_steps(dump_dir: Path) -> None:
    s = b.summarize_dir(str(dump_dir), max_steps=2)
    assert s["steps"] == [0, 1, 2, 3] and [p["step"] for p in s["per_step"]] == [2, 3]
    assert [e["analyzed"] for e in s["timeline"]] == [False] * 4 + [True] * 4
    assert s["samples"] == 4 * 64 and "newest 2 steps analyzed" in s["description"]


def test_multi_turn_prompt_len_is_the_first_generated_position(tmp_path: Path) -> None:
    """AReaL's prompt_len (actor.py:52-65): where generation starts; tool replies after it
    are neither prompt nor trained response."""
    groups = bf.make_trajectory(4, n_groups=2, group_size=3, multi_turn=True, max_new_tokens=64)
    path = tmp_path / "step_000004.pt"
    torch.save(groups, path)
    table = b.sample_table(str(path), eos_token_id=2)["rows"]
    for row in table:
        g = groups[row["group"]]
        r = row["row"]
        assert row["response_len"] == int(g["loss_mask"][r].sum())
        first = int(g["loss_mask"][r].argmax())
        assert row["prompt_len"] == first
        if int(g["turn_ids"][r].max()) == 1:  # a tool reply sits inside the completion
            seq = int(g["attention_mask"][r].sum())
            assert row["prompt_len"] + row["response_len"] < seq
