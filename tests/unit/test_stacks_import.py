"""`stacks --import`: plain `py-spy dump` text into a capture that is diagnosed, saved,
reopened and compared like a live one.

Fixtures in tests/data/pyspy_text/:
- guide_pattern_{a,b,c}.txt: the three hang patterns exactly as AReaL's debugging guide
  prints them (docs/en/best_practices/debugging.md:293-305, 312-318 and 325-327 at AReaL
  cbff54d645d2cd8ee1f1c358a82f3f473588433d), annotations (`← ...`) included;
- single_controller_loop.txt: the guide's own loop (debugging.md:278-281, `echo
  "========== PID $pid =========="; py-spy dump --pid $pid`) run by py-spy 0.4.3 over
  `ps aux | grep 'python.*areal'` of a real hung run of tests/jobs/areal_controller.py (two
  actor workers whose EngineWorker threads hang in gloo: rank 0 in a barrier, rank 1 never
  reaching it), bash wrappers included;
- rank0.txt, rank1.txt: `py-spy dump --pid` of those two workers; rank0_locals.txt the same
  with `--locals`.
Machine paths in the recorded ones are rewritten to the neutral root of
tests/support/fixtures/neutral_paths.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from areal_console.core.stacks import RankStack, analyse, diagnose
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.pyspy_text import import_text_dumps, parse_text
from conftest import run_cli

DATA = Path(__file__).resolve().parents[1] / "data" / "pyspy_text"


def imported(*names: str) -> dict:
    out = run_cli("stacks", "--import", *(str(DATA / n) for n in names), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("name", "pattern", "ranks"),
    [
        ("guide_pattern_a.txt", "cleanup_deadlock", [0, 1]),
        ("guide_pattern_b.txt", "collective_mismatch", [0, 1]),
        ("guide_pattern_c.txt", "same_collective", [0]),
    ],
)
def test_the_guides_three_patterns_as_printed(name: str, pattern: str, ranks: list[int]) -> None:
    doc = imported(name)
    assert doc["diagnosis"]["pattern"] == pattern, doc["diagnosis"]
    assert sorted(r["rank"] for r in doc["ranks"]) == ranks


def test_guide_pattern_details_survive_the_import() -> None:
    a = import_text_dumps([DATA / "guide_pattern_a.txt"])
    exited, running = a.rank_stacks
    # Leaf first; annotations stripped; no line numbers in the guide's text -> 0.
    assert [f.function for f in exited.work_frames] == [
        "destroy_process_group", "destroy", "close", "__exit__",
    ]  # fmt: skip
    assert exited.work_frames[2].file == "sft_trainer.py" and exited.work_frames[2].line == 0
    assert running.work_frames[-1].function == "_run_train"
    d = diagnose(analyse(a))
    assert "rank 0 entered a cleanup path (destroy_process_group)" in d.detail.lower()
    b = import_text_dumps([DATA / "guide_pattern_b.txt"])
    sites = {r.rank: r.work_frames[1].location for r in b.rank_stacks}
    assert sites == {0: "some_module.py:123", 1: "some_module.py:456"}


def test_pattern_c_as_one_file_per_rank(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        shutil.copy(DATA / "guide_pattern_c.txt", tmp_path / f"rank{rank}.txt")
    out = run_cli("stacks", "--import", *(str(tmp_path / f"rank{r}.txt") for r in (2, 0, 1)),
                  "--json")  # fmt: skip
    doc = json.loads(out.stdout)
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2]
    assert doc["diagnosis"]["pattern"] == "same_collective"
    assert doc["diagnosis"]["title"] == "Every rank waits in the same collective"
    assert doc["groups"][0]["label"] == "0-2"


def test_the_guides_loop_over_a_real_single_controller_run() -> None:
    doc = imported("single_controller_loop.txt")
    ranks = {r["rank"]: r for r in doc["ranks"] if r["rank"] is not None}
    assert sorted(ranks) == [0, 1]  # from each worker's --worker-index
    assert all("--role actor" in r["cmdline"] for r in ranks.values())
    others = sorted((r["role"], r["state"]) for r in doc["ranks"] if r["rank"] is None)
    assert others == [("controller", "ok"), ("wrapper", "error"), ("wrapper", "error")]
    wrapper = next(r for r in doc["ranks"] if r["role"] == "wrapper")
    assert wrapper["error"].startswith("not a Python process (a shell wrapper?)")
    diagnosis = doc["diagnosis"]
    assert diagnosis["pattern"] == "same_collective"
    assert diagnosis["title"] == "Ranks wait in one collective for a straggler"
    assert diagnosis["evidence"][:2] == [
        "rank 0 (1): train_batch (areal/infra/rpc/rpc_server.py:62) -> barrier "
        "(torch/distributed/distributed_c10d.py:5356)",
        "rank 1 (1): slow_step (areal/infra/rpc/rpc_server.py:45)",
    ]
    # The groups are the EngineWorker threads, where the work is.
    engine = next(t for t in ranks[0]["threads"] if t["name"] == "EngineWorker")
    assert doc["groups"][0]["frames"] == engine["frames"]


def test_one_file_per_rank_and_locals_read_alike() -> None:
    plain = import_text_dumps([DATA / "rank0.txt", DATA / "rank1.txt"])
    with_locals = import_text_dumps([DATA / "rank0_locals.txt", DATA / "rank1.txt"])
    assert [r.rank for r in plain.rank_stacks] == [0, 1]
    for a, b in zip(plain.rank_stacks, with_locals.rank_stacks, strict=True):
        assert [(t.name, t.frames) for t in a.threads] == [(t.name, t.frames) for t in b.threads]
    assert diagnose(analyse(plain)).pattern == "same_collective"


def test_rank_from_file_name_header_or_order(tmp_path: Path) -> None:
    text = (DATA / "guide_pattern_c.txt").read_text()
    (tmp_path / "node3-rank_7.log").write_text(text)
    (tmp_path / "dump.txt").write_text("# Rank 4\n" + text.split("\n", 1)[1])
    sections = parse_text((DATA / "guide_pattern_b.txt").read_text(), "b.txt")
    assert [s.header_rank for s in sections] == [0, 1]
    capture = import_text_dumps([tmp_path / "node3-rank_7.log", tmp_path / "dump.txt"])
    assert sorted(r.rank for r in capture.ranks if r.rank is not None) == [4, 7]


def test_imports_are_saved_listed_reopened_and_compared() -> None:
    first = run_cli("stacks", "--import", str(DATA / "single_controller_loop.txt"))
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.split()[2]
    second = run_cli("stacks", "--import", str(DATA / "rank0.txt"), str(DATA / "rank1.txt"))
    second_id = second.stdout.split()[2]
    listing = json.loads(run_cli("stacks", "--list", "--json").stdout)["captures"]
    assert {first_id, second_id} <= {c["id"] for c in listing}
    reopened = run_cli("stacks", "--open", first_id)
    assert reopened.returncode == 0 and reopened.stdout == first.stdout
    compared = run_cli("stacks", "--compare", first_id, second_id)
    assert compared.returncode == 0, compared.stderr
    assert "same: ranks 0-1" in compared.stdout
    third = run_cli("stacks", "--import", str(DATA / "guide_pattern_b.txt"))
    compared = run_cli("stacks", "--compare", second_id, third.stdout.split()[2])
    assert "changed: ranks 0-1" in compared.stdout


def test_bad_import_files_are_one_line_errors(tmp_path: Path) -> None:
    missing = run_cli("stacks", "--import", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: --import: {tmp_path / 'nope.txt'} is not a file"
    empty = tmp_path / "notes.txt"
    empty.write_text("the job hung again, see slack\n")
    result = run_cli("stacks", "--import", str(empty))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --import: {empty}: no py-spy stack found (expected `py-spy dump` output)"
    ]
    assert "Traceback" not in result.stderr


def test_spmd_rollout_stall_from_areal_frames() -> None:
    """SPMD: the data-parallel head waits for rollout in AReaL's dispatcher while its peer
    waits for the batch in a broadcast. Frames are AReaL's call chain at cbff54d6:
    areal/trainer/rl_trainer.py:699 -> areal/engine/fsdp_engine.py:609 ->
    areal/infra/dist_rollout.py:257 (head) or :271 -> :141 (peers) ->
    areal/engine/sglang_remote.py:637 -> areal/infra/remote_inf_engine.py:1415 ->
    areal/infra/workflow_executor.py:1445 -> :729 -> :611; the producer thread at :471."""
    doc = imported("spmd_rollout_stall.txt")
    d = doc["diagnosis"]
    assert d["pattern"] == "rollout_stall", d
    assert d["detail"].startswith(
        "Rank 0 waits for rollout results in wait_results "
        "(areal/infra/workflow_executor.py:611), called from prepare_batch "
        "(areal/infra/dist_rollout.py:257); rank 1 waits at a barrier or broadcast. "
    )
    assert d["evidence"][0] == (
        "rank 0: prepare_batch (areal/infra/dist_rollout.py:257) -> wait_results "
        "(areal/infra/workflow_executor.py:611)"
    )
    assert any("_get_next_task_for_submission (areal/infra/workflow_executor.py:471)" in e
               for e in d["evidence"])  # fmt: skip
    assert "rank 1: at a barrier or broadcast" in d["evidence"]


def test_pasted_text_on_stdin() -> None:
    import subprocess
    import sys

    from conftest import cli_env

    result = subprocess.run(
        [sys.executable, "-m", "areal_console", "stacks", "--import", "-", "--json"],
        input=(DATA / "guide_pattern_b.txt").read_text(),
        capture_output=True, text=True, timeout=120, env=cli_env(), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["diagnosis"]["pattern"] == "collective_mismatch"
    assert {r["node"] for r in doc["ranks"]} == {"stdin"}


def test_a_capture_is_analysed_once_for_every_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json --save DIR`: the saved file, the printed JSON and the exported files all come
    from one merge and one diagnosis, and say the same."""
    import areal_console.core.stacks.report as report
    from areal_console.cli import main
    from areal_console.core.stacks.store import load_capture

    calls = {"analyse": 0, "diagnose": 0}
    real_analyse, real_diagnose = report.analyse, report.diagnose

    def counted_analyse(capture: object) -> object:
        calls["analyse"] += 1
        return real_analyse(capture)  # type: ignore[arg-type]

    def counted_diagnose(analysis: object) -> object:
        calls["diagnose"] += 1
        return real_diagnose(analysis)  # type: ignore[arg-type]

    monkeypatch.setattr(report, "analyse", counted_analyse)
    monkeypatch.setattr(report, "diagnose", counted_diagnose)
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    files = [str(DATA / "rank0.txt"), str(DATA / "rank1.txt")]
    assert main(["stacks", "--import", *files, "--json", "--save", str(tmp_path / "out")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert calls == {"analyse": 1, "diagnose": 1}
    exported = json.loads((tmp_path / "out" / f"{printed['id']}.json").read_text())
    assert exported == printed
    saved = json.loads((tmp_path / "data" / "captures" / f"{printed['id']}.json").read_text())
    assert saved == printed
    text = (tmp_path / "out" / f"{printed['id']}.txt").read_text()
    assert f"DIAGNOSIS [{printed['diagnosis']['pattern']}]" in text
    # reopening analyses the saved capture afresh: the same groups and diagnosis
    reopened = load_capture(printed["id"])
    assert [g.ranks for g in real_analyse(reopened).groups] == [
        g["ranks"] for g in printed["groups"]
    ]


def pyspy_text(rank: RankStack) -> str:
    """A rank of a recorded capture as `py-spy dump` prints it (no rank in the text)."""
    lines = [f"Process {rank.pid}: python train.py", "Python v3.11.7 (/usr/bin/python3.11)", ""]
    for t in rank.threads:
        lines.append(f'Thread {t.tid} (idle): "{t.name}"')
        lines += [f"    {f.function} ({f.file}:{f.line})" for f in t.frames]
        lines.append("")
    return "\n".join(lines)


def write_dumps(tmp_path: Path, names: dict[int, str]) -> list[str]:
    """The recorded 4-rank mismatch's dumps of `names`' ranks, one file each (returned in
    the order given)."""
    recorded = DATA.parent / "pyspy" / "collective_mismatch.json"
    capture = build_capture(json.loads(recorded.read_text()))
    for rank, name in names.items():
        found = capture.find_rank(rank)
        assert found is not None
        (tmp_path / name).write_text(pyspy_text(found))
    return [str(tmp_path / name) for name in names.values()]


def test_unnumbered_files_follow_argument_order_and_the_report_names_them(tmp_path: Path) -> None:
    # Rank 1 (the odd one of ranks 0-2) saved as a.txt: it becomes rank 0, and says so.
    files = write_dumps(tmp_path, {1: "a.txt", 0: "b.txt", 2: "c.txt"})
    out = run_cli("stacks", "--import", *files)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index(
        "Ranks follow argument order (not every file name has a rank number); files:"
    )
    assert lines[start + 1 : start + 4] == [
        f"  rank {r}: {name} (pid {pid})"
        for r, name, pid in ((0, "a.txt", 15383), (1, "b.txt", 15382), (2, "c.txt", 15384))
    ]
    doc = json.loads(run_cli("stacks", "--import", *files, "--json").stdout)
    assert doc["rank_source"] == "argument_order"
    assert {r["rank"]: r["node"] for r in doc["ranks"]} == {0: "a.txt", 1: "b.txt", 2: "c.txt"}


@pytest.mark.parametrize("pattern", ["rank-{}.txt", "dump_{}.txt", "node7.rank{}.log"])
def test_every_file_named_with_a_number_gives_the_rank(tmp_path: Path, pattern: str) -> None:
    files = write_dumps(tmp_path, {r: pattern.format(r) for r in (2, 0, 3, 1)})
    out = run_cli("stacks", "--import", *files, "--json")
    doc = json.loads(out.stdout)
    assert doc["rank_source"] == "file_name"
    assert {r["rank"]: r["pid"] for r in doc["ranks"]} == {
        0: 15382, 1: 15383, 2: 15384, 3: 15385,
    }  # fmt: skip
    text = run_cli("stacks", "--import", *files).stdout
    assert "Ranks from the numbers in the file names; files:" in text
    assert f"  rank 2: {pattern.format(2)} (pid 15384)" in text


def test_one_file_without_a_number_makes_the_order_rule_apply(tmp_path: Path) -> None:
    files = write_dumps(tmp_path, {0: "rank0.txt", 1: "rank1.txt", 2: "slow.txt"})
    doc = json.loads(run_cli("stacks", "--import", *files, "--json").stdout)
    assert doc["rank_source"] == "argument_order"
    assert {r["rank"]: r["node"] for r in doc["ranks"]} == {
        0: "rank0.txt", 1: "rank1.txt", 2: "slow.txt",
    }  # fmt: skip
