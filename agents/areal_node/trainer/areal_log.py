"""AReaL's stats log, written the way AReaL writes it."""

from __future__ import annotations

import json
import os
import time
from typing import Any

# AReaL's stats log: what its StatsLogger prints per step (areal/utils/stats_logger.py:135-162
# at cbff54d6), so the console's Health view reads this trainer like an AReaL run. Written
# without tabulate/colorlog (it runs on nodes with torch only); the console's tests
# check it against the real packages.

# Our metrics under the names AReaL's actor, engine and workflow log them.
AREAL_NAMES = {
    "task_reward": "ppo_actor/task_reward/avg",
    "seq_len": "ppo_actor/seq_len/avg",
    "no_eos_ratio": "ppo_actor/no_eos_ratios/avg",
    "importance_weight": "ppo_actor/update/importance_weight/avg",
    "behave_imp_weight": "ppo_actor/update/behave_imp_weight/avg",
    "actor_loss": "ppo_actor/update/actor_loss/avg",
    "grad_norm": "ppo_actor/update/grad_norm",
}
# areal/utils/logging.py:15-22 (header and format), :38-60 (StatsLogger is light_green)
AREAL_HEADER = "\033[1;38;2;180;140;80m(AReaL)\033[0m"
LIGHT_GREEN, RESET = "\033[92m", "\033[0m"


def areal_stats(metrics: dict[str, float | None], time_s: float) -> dict[str, float]:
    # A stat with no value (no tokens left to average) is left out, as AReaL's stats
    # tracker drops None results (areal/utils/stats_tracker.py:402-404).
    stats = {
        AREAL_NAMES[k]: float(v) for k, v in metrics.items() if k in AREAL_NAMES and v is not None
    }
    reward = metrics.get("task_reward")
    if reward is not None:
        stats["rollout/reward"] = float(reward)  # no filtering here: every sample counts
    stats["timeperf/train_step"] = float(time_s)
    return stats


def _decimals(text: str) -> int:
    """Digits after the point of a formatted number (-1 for nan/inf), as tabulate counts."""
    pos = text.rfind(".")
    return len(text) - pos - 1 if pos >= 0 else -1


def stats_table(stats: dict[str, float], col: int = 4) -> str:
    """areal/utils/printing.py:6-21: four key/value pairs a row, column-major, `.4e`, in
    tabulate's `fancy_grid` (keys left-aligned, values aligned on the decimal point)."""
    items = list(stats.items())
    rows = (len(items) + col - 1) // col
    columns: list[list[str]] = []
    for j in range(col):
        chunk = items[j * rows : (j + 1) * rows]
        if not chunk:
            break
        keys = [k for k, _ in chunk] + [""] * (rows - len(chunk))
        values = [format(v, ".4e") for _, v in chunk]
        most = max(_decimals(v) for v in values)
        values = [v + " " * (most - _decimals(v)) for v in values]
        width = max(len(v) for v in values)
        columns.append([k.ljust(max(len(k) for k in keys)) for k in keys])
        columns.append([v.rjust(width) for v in values] + [" " * width] * (rows - len(chunk)))
    widths = [len(c[0]) for c in columns]

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    lines = [rule("╒", "═", "╤", "╕")]
    for i in range(rows):
        if i:
            lines.append(rule("├", "─", "┼", "┤"))
        lines.append("│ " + " │ ".join(c[i] for c in columns) + " │")
    lines.append(rule("╘", "═", "╧", "╛"))
    return "\n".join(lines)


def areal_log_line(message: str, when: float) -> str:
    """One StatsLogger record as rank 0's stdout carries it (AReaL's areal/utils/logging.py:
    218-229, the `plain` format "%(log_color)s" + LOG_FORMAT, in StatsLogger's light_green,
    :60; reset appended)."""
    stamp = time.strftime("%Y%m%d-%H:%M:%S", time.localtime(when))
    millis = int((when - int(when)) * 1000)
    if os.environ.get("NO_COLOR"):  # https://no-color.org: `areal-console trainer | less`
        return f"(AReaL) {stamp}.{millis:03d} StatsLogger INFO: {message}"
    return (f"{LIGHT_GREEN}{AREAL_HEADER} {LIGHT_GREEN}{stamp}.{millis:03d} StatsLogger INFO: "
            f"{message}{RESET}")  # fmt: skip


def log_areal_step(step: int, last: int, stats: dict[str, float], writer: Any) -> None:
    """The progress line, `Stats (1/1):` and the table; tensorboard at global step `step - 1`."""
    now = time.time()
    print(areal_log_line(f"Epoch 1/1 Step {step}/{last} Train step {step}/{last} done.", now))
    print(areal_log_line("Stats (1/1):", now))
    print(areal_log_line("\n" + stats_table(stats), now), flush=True)
    if writer is not None:
        for key, value in stats.items():
            writer.add_scalar(key, value, step - 1)
        writer.flush()


def tensorboard_writer(path: str | None) -> Any:
    """torch's SummaryWriter (the same event files as AReaL's tensorboardX); None without
    the `tensorboard` package."""
    if not path:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("note: the tensorboard package is not installed here; not writing events")
        return None
    return SummaryWriter(log_dir=path)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def write_jsonl(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
