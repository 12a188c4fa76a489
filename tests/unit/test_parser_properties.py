"""Property-based tests of every console parser that reads what others wrote: Flight
Recorder traces (the JSON the agent relays, and dumps decoded from pickles as the agent
decodes them), AReaL metric logs, tensorboard event files, py-spy text, and inventory
files. Inputs are real files (recorded dumps, logs written the way AReaL writes them, a
real tensorboardX event file) mutated by Hypothesis, plus arbitrary data.

Each parser must answer within a time and memory bound with a result or its own error
type, never another exception. The examples are fixed (the "ci" profile in conftest.py:
derandomized, fixed counts, a deadline per example), so a run is never flaky.
"""

from __future__ import annotations

import functools
import json
import math
import pickle
import resource
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from areal_console.core.common.errors import UserError
from areal_console.core.ledger import build_ledger
from areal_console.core.ledger.trace import RankTrace, TraceError, parse_trace
from areal_console.core.metrics.logparse import LogParser
from areal_console.core.metrics.store import MetricStore
from areal_console.core.metrics.tboard import TensorboardReader
from areal_console.core.stacks.pyspy_text import parse_text, sections_to_capture
from areal_console.core.targets.inventory import load_inventory
from areal_node.agent.flight_recorder import (
    TraceDumpError,
    decode_dump,
    safe_unpickle,
    slim_trace,
)
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from tests.support.areal_logfmt import AReaLLogWriter, actor_stats

DATA = Path(__file__).parents[1] / "data"
T = TypeVar("T")


def bounded(work: Callable[[], T], seconds: float, megabytes: float, traced: bool = True) -> T:
    """`work()`'s result; it must finish within `seconds`, and a second run (traced, which
    slows it) must allocate at most `megabytes` at its peak. `work` starts from scratch.
    Untraced (`traced=False`, for deep recursion, which tracing slows 50x), the bound is on
    how much the process's peak resident size grew."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    result = work()
    took = time.perf_counter() - t0
    assert took < seconds, f"took {took:.2f}s (bound {seconds}s)"
    if not traced:
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) * 1024
        assert grew < megabytes * 2**20, f"peak grew {grew / 2**20:.1f} MB (bound {megabytes} MB)"
        return result
    tracemalloc.start()
    try:
        work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < megabytes * 2**20, f"peak {peak / 2**20:.1f} MB (bound {megabytes} MB)"
    return result


# Arbitrary JSON values, and a real trace or file with one part replaced by one of them.
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**60, max_value=2**80)
    | st.floats()
    | st.text(max_size=30)
    | st.just("9" * 5000)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


hostile_values = json_values | st.integers(min_value=900, max_value=60_000).map(nested)


def replace_somewhere(draw: st.DrawFn, doc: Any, value: Any) -> Any:
    """`doc` with the value at a drawn path (a mapping's key or a list's index) replaced."""
    if isinstance(doc, dict) and doc and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(doc, key=str)))
        return {**doc, key: replace_somewhere(draw, doc[key], value)}
    if isinstance(doc, list) and doc and draw(st.booleans()):
        i = draw(st.integers(0, len(doc) - 1))
        return [*doc[:i], replace_somewhere(draw, doc[i], value), *doc[i + 1 :]]
    return value


# --------------------------------------------------------------------------------------
# Flight Recorder traces


@functools.cache
def slim_traces() -> tuple[dict[str, Any], ...]:
    """The agent's reduced traces of every recorded rank (as they travel: JSON)."""
    out = []
    for path in sorted((DATA / "fr").glob("*/rank_*")):
        out.append(json.loads(json.dumps(slim_trace(safe_unpickle(path.read_bytes())))))
    return tuple(out)


@functools.cache
def decoded_dumps() -> tuple[dict[str, Any], ...]:
    return tuple(safe_unpickle(p.read_bytes()) for p in sorted((DATA / "fr").glob("*/rank_*")))


def check_trace(data: Any) -> None:
    """`parse_trace` gives a usable trace or a TraceError; the ledger is built either way."""
    try:
        trace: RankTrace | None = parse_trace(1, "n", "live", "/s", data)
    except TraceError as exc:
        assert str(exc).startswith("malformed trace")
        trace = None
    good = parse_trace(0, "n", "live", "/s", slim_traces()[0])
    ledger = build_ledger([good, *([trace] if trace else [])], world_size=4)
    json.dumps(ledger.to_json())
    for group in ledger.groups:
        group.summary()
        group.findings()


@given(st.data())
def test_trace_json_from_a_rank(data: st.DataObject) -> None:
    base = data.draw(st.sampled_from(slim_traces()))
    if data.draw(st.booleans()):
        doc = data.draw(hostile_values)
    else:
        doc = replace_somewhere(data.draw, base, data.draw(hostile_values))
    bounded(lambda: check_trace(doc), seconds=1, megabytes=64)


@given(st.data())
def test_trace_dump_pickles_as_the_agent_decodes_them(data: st.DataObject) -> None:
    dump = data.draw(st.sampled_from(decoded_dumps()))
    mutated = replace_somewhere(data.draw, dump, data.draw(json_values))
    blob = pickle.dumps(mutated, protocol=data.draw(st.integers(2, 5)))

    def relay() -> None:
        try:
            relayed = json.loads(json.dumps(decode_dump(blob)))
        except TraceDumpError:
            return  # the agent's own per-rank error: nothing else may escape
        check_trace(relayed)

    bounded(relay, seconds=1, megabytes=64)


# --------------------------------------------------------------------------------------
# AReaL metric logs


@functools.cache
def real_log() -> bytes:
    """A 12-step single-controller main.log written as AReaL writes it."""
    with tempfile.TemporaryDirectory() as tmp:
        writer = AReaLLogWriter(Path(tmp))
        writer.now = writer.start = 1_700_000_000.0
        for step in range(12):
            writer.now += 30
            writer.commit(0, step, step, actor_stats(step))
        writer.close()
        return (Path(tmp) / "main.log").read_bytes()


def feed(log: bytes, cuts: list[int]) -> LogParser:
    parser = LogParser(MetricStore())
    at = 0
    for cut in sorted(set(cuts)):
        parser.feed(log[at:cut])
        at = cut
    parser.feed(log[at:])
    return parser


def steps_and_values(parser: LogParser) -> tuple[list[int], dict[str, list[float]]]:
    store = parser.store
    values = {n: [v for v in store.series(n)[1]] for n in store.names()}
    return list(store.steps), values


def mutated_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few edits: bytes flipped, inserted or cut, digits grown, a slice repeated."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "cut", "digits", "repeat"]))
        if kind == "flip":
            out[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            out[at:at] = draw(st.binary(max_size=64))
        elif kind == "cut":
            del out[at : at + draw(st.integers(1, 4096))]
        elif kind == "digits":
            out[at:at] = b"9" * draw(st.sampled_from([19, 400, 5000]))
        else:
            out[at:at] = out[at : at + draw(st.integers(1, 2048))] * draw(st.integers(2, 5))
    return bytes(out)


@given(st.data())
def test_metric_log_chunking_never_changes_the_answer(data: st.DataObject) -> None:
    log = real_log()
    cuts = data.draw(st.lists(st.integers(0, len(log)), max_size=12))
    parser = bounded(lambda: feed(log, cuts), seconds=1, megabytes=64)
    assert steps_and_values(parser) == steps_and_values(feed(log, []))
    assert list(parser.store.steps) == list(range(12)) and parser.finished


@given(st.data())
def test_metric_log_mutated_or_arbitrary(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        log = mutated_bytes(data.draw, real_log())
    else:
        log = data.draw(st.binary(max_size=4096))
    cuts = data.draw(st.lists(st.integers(0, len(log)), max_size=6))
    parser = bounded(lambda: feed(log, cuts), seconds=1, megabytes=64)
    steps = list(parser.store.steps)
    assert steps == sorted(set(steps))
    assert all(0 <= s < 2**63 for s in steps)
    for name in parser.store.names():
        assert all(isinstance(v, float) for v in parser.store.series(name)[1])


# --------------------------------------------------------------------------------------
# Tensorboard event files


@functools.cache
def real_events() -> tuple[bytes, dict[int, float]]:
    """A tensorboardX event file of 20 steps, and the values it holds."""
    from tensorboardX import SummaryWriter

    values = {step: 0.25 * step - 1 for step in range(20)}
    with tempfile.TemporaryDirectory() as tmp:
        writer = SummaryWriter(log_dir=tmp)
        for step, value in values.items():
            writer.add_scalar("ppo_actor/task_reward/avg", value, step)
        writer.close()
        (events,) = Path(tmp).glob("events.out.tfevents.*")
        return events.read_bytes(), values


def record(data: bytes, length: int | None = None) -> bytes:
    head = struct.pack("<Q", len(data) if length is None else length)
    return (
        head
        + struct.pack("<I", masked_crc32c(head))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


@given(st.data())
def test_event_files_mutated_never_yield_a_corrupt_value(data: st.DataObject) -> None:
    original, values = real_events()
    choice = data.draw(st.sampled_from(["mutate", "impossible length", "arbitrary records"]))
    if choice == "mutate":
        blob = mutated_bytes(data.draw, original)
    elif choice == "impossible length":
        length = data.draw(st.integers(2**20 + 1, 2**64 - 1))
        blob = original + record(b"", length)[:12] + data.draw(st.binary(max_size=64))
    else:
        blob = original + b"".join(
            record(d) for d in data.draw(st.lists(st.binary(max_size=200), max_size=5))
        )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "events.out.tfevents.1.host").write_bytes(blob)

        def read() -> TensorboardReader:
            reader = TensorboardReader(tmp)
            reader.poll()
            reader.poll()  # a second poll reads nothing new and fails nothing new
            return reader

        reader = bounded(read, seconds=1, megabytes=64)
    store = reader.store
    for name in store.names():
        steps, got = store.series(name)
        if name == "ppo_actor/task_reward/avg" and choice != "arbitrary records":
            # Every record that passed its CRC is the writer's own: no value is corrupt.
            for step, value in zip(steps, got, strict=True):
                assert step in values and math.isclose(value, values[step], rel_tol=1e-6)
    if choice == "impossible length":
        assert any("not an event file of scalars" in e for e in reader.errors.values())


# --------------------------------------------------------------------------------------
# py-spy text


@functools.cache
def real_pyspy() -> tuple[str, ...]:
    return tuple(p.read_text() for p in sorted((DATA / "pyspy_text").glob("*.txt")))


def pyspy_line(draw: st.DrawFn) -> str:
    return draw(
        st.sampled_from(
            [
                "Process {n}: python -m areal.infra.rpc.rpc_server --role actor --worker-index {n}",
                "========== PID {n} ==========",
                'Thread {n} (idle): "MainThread"',
                "    fn{n} (file{n}.py:{n})",
                "# Rank {n}",
                "Error: {t}",
                "        x = {t}",
                "    {t} ({t}:{n})",
            ]
        )
    ).format(
        n=draw(st.sampled_from(["0", "7", "9" * 19, "9" * 5000, "-1", "٣"])),
        t=draw(st.text(max_size=40)),
    )


@given(st.data())
def test_pyspy_text_mutated_or_arbitrary(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["mutate", "lines", "arbitrary"]))
    if kind == "mutate":
        raw = data.draw(st.sampled_from(real_pyspy())).encode()
        text = mutated_bytes(data.draw, raw).decode("utf-8", "replace")
    elif kind == "lines":
        text = "\n".join(pyspy_line(data.draw) for _ in range(data.draw(st.integers(0, 40))))
    else:
        text = data.draw(st.text(max_size=2000))
    source = data.draw(st.sampled_from(["rank3.txt", "stdin"]))
    capture = bounded(
        lambda: sections_to_capture(parse_text(text, source)), seconds=1, megabytes=64
    )
    for rank in capture.ranks:
        assert rank.state in ("ok", "error")
        assert rank.rank is None or 0 <= rank.rank < 10**9


# --------------------------------------------------------------------------------------
# Inventory files

node_entries = st.fixed_dictionaries(
    {},
    optional={
        "name": json_leaves,
        "host": json_leaves | st.sampled_from(["gpu[01-04]", "n[5-3]", "n[0-100000]", "a@b:22"]),
        "user": json_leaves,
        "port": json_leaves,
        "groups": json_values,
        "python": json_leaves,
        "bogus": json_leaves,
    },
)
inventories = st.fixed_dictionaries(
    {},
    optional={"nodes": st.lists(node_entries, max_size=6) | json_values, "defaults": json_values},
)


def check_loader(load: Callable[[Path], T], text: str, traced: bool = True) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.yaml"
        path.write_text(text)

        def read() -> None:
            try:
                load(path)
            except UserError as exc:
                assert str(exc) and "\n" not in str(exc).strip()

        # A 100,000-deep document is refused in about 3 s here (the loader's own cost):
        # the bound is 10x that; the memory bound is the one that catches an expansion.
        bounded(read, seconds=30, megabytes=64, traced=traced)


@given(st.data())
def test_inventory_documents(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        text = yaml.safe_dump(data.draw(inventories), allow_unicode=True)
    else:
        text = data.draw(st.text(max_size=600))
    check_loader(load_inventory, text)


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_inventory_nested_deep(depth: int) -> None:
    check_loader(load_inventory, "nodes: " + "[" * depth + "]" * depth, traced=False)
