"""Stacks at AReaL's scale: the py-spy text of 4,096 ranks (three threads of ~50 frames
each, frames from the recorded dumps; tests/support/fixtures/pyspy_scale.py) is imported,
saved, reopened and diagnosed; the import's bounds grow with the job and still refuse
hostile text in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from areal_console.core.stacks import pyspy_text
from areal_console.core.stacks.pyspy_text import (
    FrameLines,
    ImportTooLarge,
    import_text_dumps,
    parse_text,
)
from areal_console.core.stacks.report import analysed, compact_json
from areal_console.core.stacks.store import load_capture

from tests.conftest import run_cli
from tests.support.fixtures.pyspy_scale import laggards_of, rank_dump, write_job

DATA = Path(__file__).resolve().parents[1] / "data"
RANKS = 4096


@pytest.fixture(scope="module")
def job_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_job(tmp_path_factory.mktemp("job"), RANKS)


def test_the_generated_job_is_deep_and_made_of_recorded_frames(job_files: list[Path]) -> None:
    assert len(job_files) == RANKS // 8
    recorded = (DATA / "pyspy_text" / "rank0.txt").read_text()
    for path in (DATA / "pyspy").glob("*.json"):
        for node in json.loads(path.read_text()).get("nodes", []):
            recorded += "".join(
                f"{f['name']} ({f['short_filename']}:{f['line']})\n"
                for sample in node["samples"]
                for dump in sample
                for t in dump.get("threads") or []
                for f in t["frames"]
            )
    sections = parse_text(rank_dump(17), "node0002.txt")
    (section,) = sections
    assert [len(frames) for _, _, frames in section.threads] == [50, 50, 50]
    for _, _, frames in section.threads:
        for fn, file, line in frames:
            assert f"{fn} ({file}:{line})" in recorded


def test_4096_ranks_import_save_and_reopen(job_files: list[Path]) -> None:
    imported = run_cli("stacks", "--import", *map(str, job_files), timeout=300)
    assert imported.returncode == 0, imported.stderr
    head = imported.stdout.splitlines()
    assert head[1] == f"{RANKS} ranks ({RANKS} captured), 2 groups, 1 sample"
    assert head[3].startswith("DIAGNOSIS [collective_mismatch]")
    laggards = sorted(laggards_of(RANKS))
    assert laggards == [999, 1999, 2999, 3999, 4095]
    # The outliers are named as ranges, not as 4,091 numbers.
    assert "ranks 999,1999,2999,3999,4095 (5): " in imported.stdout
    assert "ranks 0-998,1000-1998,2000-2998,3000-3998,4000-4094 (4091): " in imported.stdout
    capture_id = head[0].split()[2]
    reopened = run_cli("stacks", "--open", capture_id, timeout=300)
    assert reopened.returncode == 0, reopened.stderr
    assert reopened.stdout == imported.stdout
    capture = load_capture(capture_id)
    assert len(capture.rank_stacks) == RANKS
    # Equal stacks are one object after reading back: 4 distinct stacks, 12,288 threads.
    assert len({id(t.frames) for r in capture.ranks for t in r.threads}) == 4


def test_the_saved_text_is_jsons_own(job_files: list[Path]) -> None:
    doc = analysed(import_text_dumps(job_files[:64], "scale")).json()
    assert compact_json(doc) == json.dumps(doc, separators=(",", ":"))
    saved = json.loads((DATA / "pyspy" / "saved_wrong_group.json").read_text())
    assert compact_json(saved) == json.dumps(saved, separators=(",", ":"))
    odd = {"ranks": [{"threads": [{"frames": []}, 5]}, {"threads": 3}, 7], "x": [1.5, None]}
    assert compact_json(odd) == json.dumps(odd, separators=(",", ":"))


def test_one_process_too_deep_is_one_line(tmp_path: Path) -> None:
    dump = tmp_path / "rank0.txt"
    lines = ["Process 1: python train.py", "Python v3.11.7", 'Thread 1 (active): "MainThread"']
    lines += [f"    f{i % 5000} (/a/b{i % 300}.py:{i % 1000})" for i in range(1_000_000)]
    dump.write_text("\n".join(lines) + "\n")
    result = run_cli("stacks", "--import", str(dump))
    assert result.returncode == 1, result.stderr
    assert result.stderr == (
        f"error: --import: {dump}: process 1 has more than 50,000 frames: not a py-spy dump "
        "(one process's threads are at most a few thousand frames)\n"
    )


def test_distinct_frames_are_bounded() -> None:
    text = rank_dump(0)
    parse_text(text, "a.txt", FrameLines(limit=200))  # the generator's 57 distinct lines
    with pytest.raises(ImportTooLarge, match=r"more than 20 distinct frames in this import"):
        parse_text(text, "a.txt", FrameLines(limit=20))


def test_the_files_of_one_import_are_bounded_together(
    job_files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    size = sum(p.stat().st_size for p in job_files[:3])
    monkeypatch.setattr(pyspy_text, "MAX_IMPORT_TOTAL", size - 1)
    import_text_dumps(job_files[:2])
    with pytest.raises(ImportTooLarge, match=r"larger than 0 MB together"):
        import_text_dumps(job_files[:3])


def test_blocks_and_lines_read_alike() -> None:
    """A thread's frames read as a block (the fast path) or line by line (CRLF text,
    annotations) give the same sections."""
    text = rank_dump(3) + rank_dump(4, laggard=True)
    fast = parse_text(text, "n.txt")
    crlf = parse_text(text.replace("\n", "\r\n"), "n.txt")
    noted = parse_text(
        text.replace("(threading.py:982)", "(threading.py:982)  \u2190 here"), "n.txt"
    )
    assert [s.threads for s in fast] == [s.threads for s in crlf] == [s.threads for s in noted]
    assert [s.pid for s in fast] == [20003, 20004] and fast[0].frames == 150
