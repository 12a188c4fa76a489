"""AReaL's metric logging, transcribed to write test logs exactly as AReaL writes them.

Transcribed from AReaL at commit cbff54d645d2cd8ee1f1c358a82f3f473588433d (file:line there;
every citation is checked by tests/unit/test_areal_citations.py, and the formats themselves
against AReaL's own code by tests/unit/test_metrics_core.py):
- `tabulate_stats`: areal/utils/printing.py:6-21 (column-major, 4 pairs per row, `.4e`,
  `fancy_grid`), run with the real `tabulate` package.
- the line format: areal/utils/logging.py:15-22 (`(AReaL)` header in colour,
  `%Y%m%d-%H:%M:%S.mmm name LEVEL: message`), the per-logger colours
  (areal/utils/logging.py:38-133; `StatsLogger` is `light_green` at areal/utils/logging.py:60,
  `RLTrainer` at areal/utils/logging.py:76) and `LoggerColoredFormatter.formatMessage`
  (areal/utils/logging.py:197-212), run with the real `colorlog` package.
- the files: `main.log` and `merged.log` (`[main]` padded to 10, on the first line of each
  record only) from `setup_file_logging` (areal/utils/logging.py:415-484); a worker's
  `<role>.log` and its `merged.log` lines (`[role]` padded to 10 on *every* line, by `sed`)
  from areal/infra/utils/proc.py:104-119; SPMD's `trainer.log` is rank 0's stdout (the
  `plain` formatter, `"%(log_color)s" + LOG_FORMAT`, areal/utils/logging.py:218-229, on
  stdout, areal/utils/logging.py:268-273) teed by the launcher
  (areal/infra/launcher/local.py:148 into areal/infra/launcher/local.py:115-118, job name
  `trainer` at areal/infra/launcher/local.py:409).
- `StatsLogger.commit` (areal/utils/stats_logger.py:135-162: progress line, `Stats (i/n):`,
  `print_stats`, tensorboardX `add_scalar(key, val, log_step + i)`) and `close`
  (areal/utils/stats_logger.py:122-133: the `Training completes!` line).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import colorlog
import colorlog.escape_codes
import colorlog.formatter
from tabulate import tabulate

AREAL_HEADER = "\033[1;38;2;180;140;80m(AReaL)\033[0m"
LOG_FORMAT = (
    f"{AREAL_HEADER} %(log_color)s%(asctime)s.%(msecs)03d %(name)s %(levelname)s: %(message)s"
)
DATE_FORMAT = "%Y%m%d-%H:%M:%S"
LOG_PREFIX_WIDTH = 10
LOGGER_COLORS = {"StatsLogger": "light_green", "RLTrainer": "light_green"}
FILE_LOG_COLORS = {
    "DEBUG": "white",
    "INFO": "white",
    "WARNING": "yellow",
    "ERROR": "red",
    "CRITICAL": "bold_white,bg_red",
}


def tabulate_stats(data: dict[str, float], col: int = 4, floatfmt: str = ".4e") -> str:
    """areal/utils/printing.py:6-21."""
    items = list(data.items())
    row_count = (len(items) + col - 1) // col
    column_major = []
    for i in range(row_count):
        row: list[Any] = []
        for j in range(col):
            index = i + j * row_count
            if index < len(items):
                row.extend(items[index])
        column_major.append(row)
    return tabulate(column_major, floatfmt=floatfmt, tablefmt="fancy_grid")


class LoggerColoredFormatter(colorlog.ColoredFormatter):
    """areal/utils/logging.py:167-212 (per-logger colour for DEBUG/INFO)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        escapes = self._escape_code_map(record.levelname)
        if record.levelno < logging.WARNING:
            escapes = dict(escapes)
            escapes["log_color"] = colorlog.escape_codes.parse_colors(
                LOGGER_COLORS.get(record.name, "white")
            )
        wrapper = colorlog.formatter.ColoredRecord(record, escapes)
        message = super(colorlog.ColoredFormatter, self).formatMessage(wrapper)  # type: ignore[arg-type]
        return self._append_reset(message, escapes)


class AReaLLogWriter:
    """Writes a run's log directory the way AReaL's controller (or SPMD launcher) does.

    mode "single": `main.log` and `merged.log` (controller), plus `actor.log` and its
    prefixed lines in `merged.log` for a worker's own output.
    mode "spmd": `trainer.log` (rank 0's coloured stdout).
    `clock` gives the record times (seconds since the epoch), so tests control step times.
    """

    def __init__(self, log_dir: Path, mode: str = "single", tensorboard: Path | None = None):
        self.log_dir = log_dir
        self.mode = mode
        log_dir.mkdir(parents=True, exist_ok=True)
        self.now = time.time()
        self._last_commit_step = -1
        self.writer = None
        if tensorboard is not None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(tensorboard))
        if mode == "single":
            self.streams = [
                (
                    open(log_dir / "main.log", "a"),  # noqa: SIM115
                    self._formatter(LOG_FORMAT),
                ),
                (
                    open(log_dir / "merged.log", "a"),  # noqa: SIM115
                    self._formatter("[main]".ljust(LOG_PREFIX_WIDTH) + LOG_FORMAT),
                ),
            ]
        else:
            self.streams = [
                (
                    open(log_dir / "trainer.log", "a"),  # noqa: SIM115
                    self._formatter("%(log_color)s" + LOG_FORMAT),
                )
            ]
        self.start = self.now

    @staticmethod
    def _formatter(fmt: str) -> logging.Formatter:
        return LoggerColoredFormatter(fmt, datefmt=DATE_FORMAT, log_colors=FILE_LOG_COLORS)

    def info(self, name: str, message: str) -> None:
        record = logging.LogRecord(name, logging.INFO, __file__, 0, message, None, None)
        record.created = self.now
        record.msecs = (self.now - int(self.now)) * 1000
        for fh, formatter in self.streams:
            fh.write(formatter.format(record) + "\n")
            fh.flush()  # StreamingFileHandler, areal/utils/logging.py:159-164

    def worker_line(self, role: str, text: str) -> None:
        """A worker's stdout line: `<role>.log` as is, `merged.log` with `[role]`
        (areal/infra/utils/proc.py:104-119)."""
        with open(self.log_dir / f"{role}.log", "a") as fh:
            fh.write(text + "\n")
        with open(self.log_dir / "merged.log", "a") as fh:
            for line in text.split("\n"):
                fh.write(f"[{role}]".ljust(LOG_PREFIX_WIDTH) + line + "\n")

    def commit(
        self,
        epoch: int,
        step: int,
        global_step: int,
        data: dict[str, float] | list[dict[str, float]],
        *,
        epochs: int = 1,
        steps_per_epoch: int = 100,
        total_steps: int = 100,
    ) -> None:
        """areal/utils/stats_logger.py:135-162."""
        self.info(
            "StatsLogger",
            f"Epoch {epoch + 1}/{epochs} "
            f"Step {step + 1}/{steps_per_epoch} "
            f"Train step {global_step + 1}/{total_steps} done.",
        )
        if isinstance(data, dict):
            data = [data]
        log_step = max(global_step, self._last_commit_step + 1)
        for i, item in enumerate(data):
            item = {k: v for k, v in item.items() if not k.endswith("__count")}
            self.info("StatsLogger", f"Stats ({i + 1}/{len(data)}):")
            self.info("StatsLogger", "\n" + tabulate_stats(item))
            if self.writer is not None:
                for key, val in item.items():
                    self.writer.add_scalar(f"{key}", val, log_step + i)
        self._last_commit_step = log_step + len(data) - 1

    def close(self) -> None:
        """areal/utils/stats_logger.py:122-133."""
        self.info(
            "StatsLogger", f"Training completes! Total time elapsed {self.now - self.start:.2f}."
        )
        self.release()

    def release(self) -> None:
        """Close the files without the completion line (a run that died or hangs)."""
        for fh, _ in self.streams:
            fh.close()
        self.streams = []
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def actor_stats(step: int, **overrides: float) -> dict[str, float]:
    """A step's stats with the keys AReaL's PPO actor and rollout export (values vary by step).

    Key names from areal/trainer/ppo/actor.py:396-439 (`ppo_actor/...`, avg/min/max from
    areal/utils/stats_tracker.py:363-372), areal/trainer/ppo/actor.py:459-484 and
    areal/trainer/ppo/actor.py:661-711 (`ppo_actor/update/...`),
    the engine's `grad_norm` (areal/engine/fsdp_engine.py:725), the workflow's
    `rollout/reward` (areal/workflow/rlvr.py:135) and `timeperf/*`
    (areal/utils/stats_tracker.py:104-105).
    """
    import math

    wobble = 0.01 * math.sin(step * 0.7)
    base: dict[str, float] = {}
    for name, avg in (
        ("advantages", 0.0 + wobble),
        ("correct_seq_len", 300.0 + step),
        ("final_reward", 0.5 + wobble),
        ("incorrect_seq_len", 350.0 + step),
        ("kl_rewards", -0.001),
        ("no_eos_ratios", 0.01 + wobble / 10),
        ("prompt_len", 120.0),
        ("seq_len", 400.0 + 5 * wobble),
        ("task_reward", 0.4 + 0.002 * step + wobble),
    ):
        base[f"ppo_actor/{name}/avg"] = avg
        base[f"ppo_actor/{name}/min"] = avg - 1.0
        base[f"ppo_actor/{name}/max"] = avg + 1.0
    for name in ("n_seqs", "n_tokens", "n_valid_tokens", "correct_n_seqs", "incorrect_n_seqs"):
        base[f"ppo_actor/{name}"] = 512.0
    base["ppo_actor/eps_clip"] = 0.2
    base["ppo_actor/mask_no_eos_with_zero"] = 0.0
    base["ppo_actor/use_dual_clip"] = 0.0
    for name, avg in (
        ("actor_loss", -0.01 + wobble),
        ("approx_kl", 0.001),
        ("behave_approx_kl", 0.002),
        ("behave_filtered_ratio", 0.0),
        ("behave_imp_weight", 1.0 + wobble / 10),
        ("clip_ratio", 0.01),
        ("dual_clip_ratio", 0.0),
        ("entropy", 0.8 - step * 0.001),
        ("importance_weight", 1.0 + wobble / 20),
        ("logp_abs_diff", 0.01),
        ("logp_diff", 0.0),
        ("new_logp", -0.5),
        ("old_logp", -0.5),
    ):
        base[f"ppo_actor/update/{name}/avg"] = avg
        base[f"ppo_actor/update/{name}/min"] = avg - 0.5
        base[f"ppo_actor/update/{name}/max"] = avg + 0.5
    base["ppo_actor/update/grad_norm"] = 0.3 + wobble
    base["ppo_actor/update/lr"] = 1e-6
    base["ppo_actor/update/n_total_tokens"] = 204800.0
    base["rollout/reward"] = 0.4 + 0.002 * step
    for name in ("train_step", "rollout", "compute_logp", "ppo_update", "update_weights"):
        base[f"timeperf/{name}"] = 10.0 + wobble
    base.update(overrides)
    return base


def write_run(
    log_dir: Path,
    steps: int,
    *,
    mode: str = "single",
    step_seconds: float = 30.0,
    start: float = 1_700_000_000.0,
    finished: bool = False,
    tensorboard: Path | None = None,
    stats: Any = actor_stats,
) -> AReaLLogWriter:
    """A run of `steps` steps, `step_seconds` apart; with AReaL's completion line if `finished`."""
    writer = AReaLLogWriter(log_dir, mode=mode, tensorboard=tensorboard)
    writer.now = writer.start = start
    for s in range(steps):
        writer.now = start + (s + 1) * step_seconds
        writer.commit(0, s, s, stats(s), steps_per_epoch=steps, total_steps=steps)
    if finished:
        writer.close()
    else:
        writer.release()
    return writer


if (
    __name__ == "__main__"
):  # regenerate a sample directory by hand: python tests/support/areal_logfmt.py DIR
    import sys

    out = Path(sys.argv[1])
    write_run(out, int(os.environ.get("STEPS", "5")), finished=True)
    print(out)
