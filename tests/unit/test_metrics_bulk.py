"""The metric log's bulk path reads exactly what the record-by-record path reads.

Logs come from tests/support/areal_logfmt.py (AReaL's StatsLogger, printing and logging code,
transcribed with citations and run with the real `tabulate` and `colorlog`). The varied run
below keeps breaking the bulk path's assumption that a record repeats the previous one's
shape, in every way an AReaL log does.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from areal_console.core.metrics.logbulk import NUMBER, scientific, word_cover, word_matrix
from areal_console.core.metrics.logparse import LogParser

from tests.support.areal_logfmt import AReaLLogWriter, actor_stats

EPOCH_STEPS = 37  # `Step s/37` rolls over, and its digit count changes, every 37 steps


def small_stats(step: int, n: int) -> dict[str, float]:
    return {f"group{i % 3}/metric_{i}": 0.1 * i + 1e-3 * step for i in range(n)}


def varied_run(log_dir: Path, steps: int, width: int) -> None:
    """Eval steps add a key; values change sign (column widths) and turn nan/inf; every 50th
    commit logs two stats dicts, every 61st an empty one; a worker's lines land in
    merged.log; the completion line comes mid-log (a run resumed in the same file)."""
    writer = AReaLLogWriter(log_dir, mode="single")
    writer.now = 1_700_000_000.25
    for s in range(steps):
        writer.now += 7.125
        stats = actor_stats(s) if width == 83 else small_stats(s, width)
        if s % 10 == 3:
            stats["eval-rollout/reward"] = 0.5 + s * 1e-3
        if s % 23 == 5:
            first = next(iter(stats))
            stats[first] = -stats[first] * 1e5
        if s % 29 == 7:
            last = list(stats)[-1]
            stats[last] = math.nan if s % 2 else -math.inf
        if s % 31 == 11:
            writer.worker_line("rollout", f"rollout worker: batch {s} done")
        data: Any = stats
        if s % 50 == 49:
            data = [stats, small_stats(s, 3)]
        elif s % 61 == 60:
            data = {}
        writer.commit(s // EPOCH_STEPS, s % EPOCH_STEPS, s, data, epochs=99,
                      steps_per_epoch=EPOCH_STEPS, total_steps=99 * EPOCH_STEPS)  # fmt: skip
        if s == steps // 2:
            writer.info("StatsLogger", "Training completes! Total time elapsed 1.00.")
    writer.release()


def snapshot(parser: LogParser) -> dict[str, Any]:
    store = parser.store
    state: dict[str, Any] = {
        "steps": list(store.steps),
        "times": [repr(t) for t in store.step_times],
        "names": store.names(),
        "finished": (parser.finished, parser.finished_at),
        "total": parser.total_steps,
        "last": parser.last_step,
    }
    for name in store.names():
        steps, values = store.series(name)
        state[name] = (steps, [repr(v) for v in values])  # repr: nan == nan, -0.0 != 0.0
    return state


def parse(data: bytes, bulk: bool, chunks: list[int] | None = None) -> LogParser:
    parser = LogParser(utc_offset=3600, bulk=bulk)
    if chunks is None:
        parser.feed(data)
        return parser
    rng, pos = random.Random(len(data)), 0
    while pos < len(data):
        n = rng.choice(chunks)
        parser.feed(data[pos : pos + n])
        pos += n
    return parser


@pytest.mark.parametrize("width", [3, 9, 10, 83])  # 10: blank cells inside the table
@pytest.mark.parametrize("name", ["main.log", "merged.log", "prefixed"])
def test_bulk_reading_equals_record_by_record_reading(
    tmp_path: Path, width: int, name: str
) -> None:
    steps = 300 if width == 83 else 600
    varied_run(tmp_path, steps, width)
    if name == "prefixed":  # a worker's own stats: `[role]` on every line (proc.py:112-119)
        lines = (tmp_path / "main.log").read_text().splitlines()
        data = "".join("[actor]".ljust(10) + line + "\n" for line in lines).encode()
    else:
        data = (tmp_path / name).read_bytes()
    reference = snapshot(parse(data, bulk=False))
    fast = parse(data, bulk=True)
    assert len(reference["steps"]) > steps  # two-dict commits add steps
    assert fast.bulk_steps > steps // 2  # most steps went the bulk way ...
    assert snapshot(fast) == reference  # ... and read the same
    for bulk in (True, False):
        chunked = parse(data, bulk, chunks=[1, 700, 5000, 70_000, 300_000, 1 << 20])
        assert snapshot(chunked) == reference


def test_a_damaged_value_inside_a_run_reads_as_the_searching_path_reads_it(
    tmp_path: Path,
) -> None:
    varied_run(tmp_path, 200, 9)
    data = (tmp_path / "main.log").read_bytes()
    at = data.index(b"e-01 ", len(data) // 2)
    damaged = data[: at - 3] + b"x" + data[at - 2 :]
    reference = snapshot(parse(damaged, bulk=False))
    assert snapshot(parse(damaged, bulk=True)) == reference
    assert any("nan" in repr(v) for v in reference.values())  # the bad cell reads as nan


def test_value_cells_decode_exactly_as_float() -> None:
    """Vectorised `%.4e` decoding equals Python's correctly rounded `float`, bit for bit;
    cells in any other shape are flagged for `float`."""
    rng = random.Random(5)
    values = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30) for _ in range(50_000)]
    values += [rng.randint(0, 99999) * 10.0 ** rng.randint(-25, 31) for _ in range(50_000)]
    values += [0.0, -0.0, 9.9999e26, 1e-18, 1.2345e-19, 1e100, 1e-100]
    cells = [f"{v:.4e} ".rjust(NUMBER).encode() for v in values]
    cells += [b"       nan  ", b"        inf ", b"  1.0000e+5 ", b" 1.0000E+05 ", b"  12345e+01 "]
    decoded, ok = decode(cells)
    assert ok.sum() > 0.7 * len(values)  # exponents -18..26 (|shift| <= 22) take this way
    assert not ok[0, len(values) :].any()  # nan, inf, odd shapes: left to float
    for cell, value, fits in zip(cells, decoded[0].tolist(), ok[0].tolist(), strict=True):
        if fits:
            assert repr(value) == repr(float(cell)), cell


def test_any_byte_out_of_shape_is_left_to_float() -> None:
    """Each byte of a `%.4e` cell replaced by every byte value: the word-wise decoder takes
    exactly the cells of AReaL's shape whose power of ten is exact (|4 - exponent| <= 22),
    and reads them as `float` does."""
    shape = re.compile(rb"[- ]\d\.\d{4}e[-+]\d\d ")
    cells = [
        base[:i] + bytes([b]) + base[i + 1 :]
        for base in (b"-1.2345e-07 ", b" 9.8765e+12 ")
        for i in range(NUMBER)
        for b in range(256)
    ]
    decoded, ok = decode(cells)
    for cell, value, fits in zip(cells, decoded[0].tolist(), ok[0].tolist(), strict=True):
        exact = shape.fullmatch(cell) is not None and abs(4 - int(cell[8:11])) <= 22
        assert fits == exact, cell
        if fits:
            assert repr(value) == repr(float(cell)), cell


def test_word_cover_compares_every_fixed_byte_and_no_other() -> None:
    """The words a record is compared by cover exactly the bytes that must repeat."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        size = int(rng.integers(8, 400))
        same = rng.random(size) < rng.choice([0.1, 0.5, 0.9, 0.99])
        full_at, part_at, masks = word_cover(same)
        compared = np.zeros(size, dtype=bool)
        for at in full_at.tolist():
            assert at + 8 <= size and same[at : at + 8].all()
            compared[at : at + 8] = True
        for at, mask in zip(part_at.tolist(), masks.tolist(), strict=True):
            assert at + 8 <= size
            picked = [(mask >> (8 * k)) & 0xFF == 0xFF for k in range(8)]
            assert all((mask >> (8 * k)) & 0xFF in (0, 0xFF) for k in range(8))
            assert same[at : at + 8][picked].all()
            compared[at : at + 8] |= picked
        assert (compared == same).all()


def decode(cells: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """`scientific` over NUMBER-byte cells laid side by side, as the bulk path reads them:
    each cell's words at its bytes 0 and 4."""
    data = b"".join(cells)
    head = word_matrix(data, 0, 1, len(data))[:, ::NUMBER]
    tail = word_matrix(data, 4, 1, len(data) - 4)[:, ::NUMBER]
    return scientific(head, tail)
