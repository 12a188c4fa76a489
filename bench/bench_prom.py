"""Parsing an inference server's `/metrics` answer of 1 MB.

    python bench/bench_prom.py [--size 1048576] [--repeats 20]

Two answers of `--size` bytes (cut at a line end): `sglang`, the real `prometheus_client`
output of SGLang's gauges and histograms for 8 tp ranks (tests/support/fixtures/rollout_formats.py, the
definitions of the release AReaL pins), repeated to the size; `hostile`, every line a
sample of a family the console reads (the parser's worst case: every line split, the
sample cap reached). For each, in the same run, median of `--repeats`: bytes decoded and
split into lines (the floor any parser pays, the baseline), the console's parser
(`areal_node.prom_text.parse_exposition`, decoding included), and `prometheus_client`'s
own text parser; ratios to the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from areal_node.prom_text import decode_body, parse_exposition  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.support.fixtures.rollout_formats import ServerState, sglang_metrics  # noqa: E402

HOSTILE_LINE = (
    'sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",'
    'pp_rank="0",tp_rank="%d"} 4.0\n'
)


def answers(size: int) -> dict[str, bytes]:
    base = sglang_metrics(ServerState(tp_ranks=8, histograms=40))
    real = (base * (size // len(base) + 1))[:size]
    hostile = "".join(HOSTILE_LINE % i for i in range(size // 60)).encode()[:size]
    return {
        name: body[: body.rfind(b"\n") + 1]
        for name, body in (("sglang", real), ("hostile", hostile))
    }


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def reference(body: bytes) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    print(
        f"{'answer':8} {'bytes':>9} {'split ms':>9} {'parse ms':>9} {'ratio':>6} {'prom_client ms':>15} {'ratio':>6} kept"
    )
    for name, body in answers(args.size).items():
        base = median_ms(lambda b=body: decode_body(b).split("\n"), args.repeats)
        ours = median_ms(lambda b=body: parse_exposition(decode_body(b)), args.repeats)
        ref = median_ms(lambda b=body: reference(b), max(3, args.repeats // 4))
        kept = len(parse_exposition(decode_body(body)).samples)
        print(
            f"{name:8} {len(body):9d} {base:9.2f} {ours:9.2f} {ours / base:6.1f} {ref:15.2f} {ref / base:6.1f} {kept}"
        )


if __name__ == "__main__":
    main()
