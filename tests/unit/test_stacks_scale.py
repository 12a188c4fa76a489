"""Stacks at AReaL's scale: the py-spy text of 4,096 ranks (three threads of ~50 frames
each, frames from the recorded dumps; tests/support/fixtures/pyspy_scale.py) is imported,
saved, reopened and diagnosed; the import's bounds grow with the job and still refuse
hostile text in one line."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from areal_console.core.stacks import pyspy_text, store
from areal_console.core.stacks.pyspy_text import (
    FrameLines,
    ImportTooLarge,
    import_text_dumps,
    parse_text,
)
from areal_console.core.stacks.report import analysed, compact_json, indented_json
from areal_console.core.stacks.store import (
    INDEX_NAME,
    INDEX_VERSION,
    load_capture,
    resolve_capture,
    save_capture,
    scan_captures,
)

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


@pytest.mark.slow
def test_4096_ranks_import_save_and_reopen(job_files: list[Path]) -> None:
    imported = run_cli("stacks", "--import", *map(str, job_files), timeout=300)
    assert imported.returncode == 0, imported.stderr
    head = imported.stdout.splitlines()
    assert head[1] == f"{RANKS} ranks ({RANKS} captured), 2 groups, 1 sample"
    assert "  ... and 496 more files (`--json` names each rank's file)" in head
    assert next(x for x in head if x.startswith("DIAGNOSIS")).startswith(
        "DIAGNOSIS [collective_mismatch]"
    )
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
    for value in (doc, saved, odd):  # `stacks --json`'s indented text, the same way
        assert indented_json(value) == json.dumps(value, indent=1)


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


# --------------------------------------------------------------------------------------
# The index of saved captures (core/stacks/store.py)


def _saved(directory: Path, n: int) -> list[Path]:
    """`n` saved imports of the recorded dumps (each diagnosed, as a user's would be)."""
    paths = []
    for i in range(n):
        capture = import_text_dumps([DATA / "pyspy_text" / "rank0.txt"], f"20260101-00000{i}-c")
        capture.captured_at = f"2026-01-01T00:00:0{i}+00:00"
        paths.append(save_capture(capture, directory))
    return paths


def _listing(directory: Path) -> tuple[list[tuple[str, str, int, str]], list[str]]:
    saved, bad = scan_captures(directory)
    return [(c.capture_id, c.captured_at, c.ranks, c.pattern) for c in saved], sorted(
        f"{b.path.name}: {b.error}" for b in bad
    )


def test_listing_and_opening_read_the_index_not_every_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _saved(tmp_path, 3)
    (tmp_path / "20260101-000009-x.json").write_text("{not json")
    expected = _listing(tmp_path)
    assert [c[0] for c in expected[0]] == [f"20260101-00000{i}-c" for i in (2, 1, 0)]
    assert expected[1] == ["20260101-000009-x.json: not JSON (Expecting property name "
                           "enclosed in double quotes: line 1 column 2 (char 1))"]  # fmt: skip

    def parse_forbidden(path: Path) -> None:
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(store, "_summary", parse_forbidden)
    assert _listing(tmp_path) == expected
    assert resolve_capture("latest", tmp_path).name == "20260101-000002-c.json"
    monkeypatch.undo()
    # A capture rewritten in place (another size, another time) is read again.
    path = tmp_path / "20260101-000001-c.json"
    doc = json.loads(path.read_text())
    doc["diagnosis"]["pattern"] = "rewritten"
    path.write_text(json.dumps(doc))
    rows, _ = _listing(tmp_path)
    assert ("20260101-000001-c", "2026-01-01T00:00:01+00:00", 1, "rewritten") in rows
    # A capture removed leaves the index with it.
    path.unlink()
    assert [c[0] for c in _listing(tmp_path)[0]] == ["20260101-000002-c", "20260101-000000-c"]
    assert "20260101-000001-c.json" not in json.loads((tmp_path / INDEX_NAME).read_text())["files"]


@pytest.mark.parametrize(
    "index",
    [
        b"{not json",
        b"[1, 2]",
        b'{"version": 2, "files": {}}',
        b'{"version": 2, "files": []}',
        b'{"version": 2, "files": {"20260101-000000-c.json": 5}}',
        b"\xff\xfe\x00garbage",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"version": 2, "files": {}}' + b" " * (17 << 20),
    ],
    ids=["text", "list", "version", "files-list", "entry-int", "bytes", "deep", "huge"],
)
def test_a_broken_index_is_ignored_and_rebuilt(tmp_path: Path, index: bytes) -> None:
    _saved(tmp_path, 2)
    expected = _listing(tmp_path)
    (tmp_path / INDEX_NAME).write_bytes(index)
    assert _listing(tmp_path) == expected
    assert json.loads((tmp_path / INDEX_NAME).read_text())["version"] == INDEX_VERSION


def test_index_entries_of_the_wrong_shape_cost_only_a_reread(tmp_path: Path) -> None:
    """Entries that claim the right file (its exact stamp) but hold values of the wrong
    type are read from the capture instead."""
    paths = _saved(tmp_path, 1)
    expected = _listing(tmp_path)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    entry = index["files"][paths[0].name]
    for bad in ({"ranks": True}, {"ranks": -1}, {"ranks": "7"}, {"id": ["x"]}, {"user": 3},
                {"title": None}, {"stamp": "x"}, {"error": 5}):  # fmt: skip
        index["files"][paths[0].name] = entry | bad
        (tmp_path / INDEX_NAME).write_text(json.dumps(index))
        assert _listing(tmp_path) == expected, bad


def test_an_index_that_is_a_fifo_or_a_directory_is_ignored(tmp_path: Path) -> None:
    _saved(tmp_path, 1)
    expected = _listing(tmp_path)
    (tmp_path / INDEX_NAME).unlink()
    os.mkfifo(tmp_path / INDEX_NAME)  # opened for reading it would block
    assert _listing(tmp_path) == expected
    (tmp_path / INDEX_NAME).unlink()
    (tmp_path / INDEX_NAME).mkdir()
    assert _listing(tmp_path) == expected


def test_scattered_outliers_are_named_in_one_short_line() -> None:
    """Every other rank of 4,096 elsewhere: the diagnosis names them in one line, the
    groups keep the full sets."""
    text = rank_dump(0) + rank_dump(1, laggard=True)
    one = parse_text(text, "n.txt")
    sections = []
    for r in range(4096):
        s = copy.deepcopy(one[r % 2])
        s.pid, s.cmdline = (
            20_000 + r,
            s.cmdline.replace("--worker-index 0 ", f"--worker-index {r} "),
        )
        s.cmdline = s.cmdline.replace("--worker-index 1 ", f"--worker-index {r} ")
        sections.append(s)
    capture = pyspy_text.sections_to_capture(sections, "scattered")
    result = analysed(capture)
    lines = [e for e in result.diagnosis.evidence if e.startswith("ranks ")]
    assert lines and all(len(e) < 250 for e in lines), lines
    assert any("... (2048 ranks in 2048 ranges)" in e for e in lines), lines
    assert sorted(len(g.ranks) for g in result.analysis.groups) == [2048, 2048]
