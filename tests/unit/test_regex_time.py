"""How long text takes: every regular expression of the console and the node package that
reads a job's text (logs, command lines, environments, config and server answers, py-spy
text, Slurm's records of other users' jobs) runs on adversarial 1 MiB input within a wide
bound (1 s of CPU time; a quadratic pattern takes minutes there). The inputs are runs of
the characters such patterns trip on: spaces, separators, brackets, quotes, the prefixes
the patterns look for.

Every module-level pattern is classified: `APPLIED` says how the code applies it (over
all of a text, or matched at the start of one line), `NOT_JOB_TEXT` why it never sees job
text. A new pattern fails `test_every_pattern_is_classified` until it is in one of them.
The report's masking regexes were quadratic (`a: b`, 100,000 spaces, `c`: 41 s); so were
Slurm's GRES list, pyvenv.cfg's lines and host aliasing per host.
"""

from __future__ import annotations

import ast
import importlib
import re
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from areal_console.core.report.redact import Redactor, is_secret_name

SIZE = 1 << 20
SCREEN = 16 << 10
BOUND = 1.0  # CPU seconds per pattern and input
UNITS = (
    " ", "\t", "\n", " \n", "=", ":", "-", ".", "/", ",", "(", "[", "{", "\\", '"', "'",
    "a.", "a=", "a: ", "--a ", '"a": "', "a://", "[0-", "sk-", "gpu:", "0.", "rank ",
    "Bearer ", " (", "=+ ", "Step 1/",
)  # fmt: skip
# Each unit alone, and between a head and a tail: a value's run of spaces (`a: b`, spaces,
# `c`), an assignment's, a frame's, a JSON string's.
HEADS = ("", "a: b", "a=", "x (", '"a": "')
INPUTS = tuple((head, unit) for head in HEADS for unit in UNITS)

# How the code applies each pattern: "text" (search or iterate over a whole text), "line"
# (match at the start of one line, as line parsers do) or "name" (through the report's
# `is_secret_name`, on a name as long as the text).
APPLIED = {
    "areal_console.core.connection.transport._NO_ISOLATED": "line",
    "areal_console.core.slurm.runs.RUN_ID": "line",
    "areal_console.core.stacks.coverage._TIMEOUT": "line",
    "areal_console.core.stacks.coverage._NO_ANSWER": "text",
    "areal_console.core.stacks.nccl_ras._MISSING_COMMA": "text",
    "areal_console.core.stacks.nccl_ras._GROUP": "line",
    "areal_console.core.stacks.nccl_ras._ONE": "line",
    "areal_console.core.stacks.nccl_ras._MISMATCH": "line",
    "areal_console.core.stacks.nccl_ras._OP": "line",
    "areal_console.core.stacks.pyspy_text._INDENTED": "text",
    "areal_console.core.common.textfmt._CONTROL": "text",
    "areal_console.core.common.textfmt._CONTROL_KEEP_LAYOUT": "text",
    "areal_console.core.common.textfmt._ANSI_CSI": "text",
    "areal_console.core.connection.transport._BOOTSTRAP_LINE": "text",
    "areal_console.core.metrics.logbulk.PROGRESS": "line",
    "areal_console.core.metrics.logbulk.TIMESTAMP": "text",
    "areal_console.core.metrics.logbulk.HEADS": "text",
    "areal_console.core.metrics.logparse.HEADS": "text",
    "areal_console.core.metrics.logparse.TIMESTAMP": "text",
    "areal_console.core.ray.versions._MISMATCH": "text",
    "areal_console.core.report.redact.SECRET_NAME": "name",
    "areal_console.core.report.redact.NOT_SECRET": "name",
    "areal_console.core.report.redact.ASSIGN": "text",
    "areal_console.core.report.redact.FLAG": "text",
    "areal_console.core.report.redact.YAML": "text",
    "areal_console.core.report.redact.JSON_PAIR": "text",
    "areal_console.core.report.redact.URL_USERINFO": "text",
    "areal_console.core.report.redact.BEARER": "text",
    "areal_console.core.report.redact.TOKEN_SHAPES": "text",
    "areal_console.core.report.redact.IPV4": "text",
    "areal_console.core.report.redact._HOST_ASSIGN": "text",
    "areal_console.core.report.redact._HOST_RUN": "text",
    "areal_console.core.rollout.staleness._STATS": "text",
    "areal_console.core.rollout.trainer_version._TRAIN_STEP": "text",
    "areal_console.core.slurm.channel._TASK_ENDED": "text",
    "areal_console.core.slurm.channel._LAUNCH_FAILED": "text",
    "areal_console.core.slurm.client._KEY": "text",
    "areal_console.core.slurm.client._GPU_IDX": "text",
    "areal_console.core.stacks.library._INSTALL_ROOT": "text",
    "areal_console.core.stacks.library._STDLIB_DIR": "text",
    "areal_console.core.stacks.pyspy_text._PID_HEADER": "line",
    "areal_console.core.stacks.pyspy_text._PROCESS": "line",
    "areal_console.core.stacks.pyspy_text._PYTHON": "line",
    "areal_console.core.stacks.pyspy_text._THREAD": "line",
    "areal_console.core.stacks.pyspy_text._COMMENT": "line",
    "areal_console.core.stacks.pyspy_text._RANK_WORD": "text",
    "areal_console.core.stacks.pyspy_text._ERROR": "line",
    "areal_console.core.stacks.pyspy_text._FILE_RANK": "text",
    "areal_node.prom_text._LABELS": "line",
    "areal_node.prom_text._ESCAPE": "text",
    "areal_node.versions.SECRET_NAME": "text",
    "areal_node.versions._CFG_VERSION": "text",
    "areal_node.versions._CFG_HOME": "text",
    "areal_node.versions._CFG_SYSTEM_SITE": "text",
}
NOT_JOB_TEXT = {
    "areal_console.core.common.rank_filter._RANK_SET": "the filter the user types; anchored, every count bounded",
    "areal_console.core.watch.evidence.FOLDER": "names of folders in the watch's own evidence folder",
    "areal_console.core.connection.client._LINE_ID": "matched on the first 64 bytes of a reply",
    "areal_console.core.rollout.job_config._INTERPOLATION": "fullmatch, {1,200} bounded",
    "areal_console.core.rollout.perf_trace.TRACE_FILE": "file names of a directory listing",
    "areal_console.core.rollout.perf_trace.SESSION_FILE": "file names of a directory listing",
    "areal_console.core.rollout.scaling._HEAD": "an allocation spec cut to 200 characters",
    "areal_console.core.rollout.scaling._DIMS": "an allocation spec cut to 200 characters",
    "areal_console.core.rollout.scaling._DIM": "an allocation spec cut to 200 characters",
    "areal_console.core.rollout.scaling._HYBRID": "an allocation spec cut to 200 characters",
    "areal_console.core.slurm.targets.JOB_ID": "the user's --slurm-job",
    "areal_console.core.targets.hostlist._NUMBER": "fullmatch of one range bound",
    "areal_console.core.targets.specs._HOST_NAME": "fullmatch, {0,252} bounded",
    "areal_console.core.connection.relay._NAME": "fullmatch, {0,199} bounded (node names)",
    "areal_node.agent.relay._NAME": "fullmatch, {0,199} bounded (relay_start's node name)",
    "areal_node.agent.jobs.JOB_ID": "job ids the console makes",
    "areal_node.agent.jobs._PLACEHOLDER": "the user's launch templates",
    "areal_node.constants.DUMP_FILE": "file names of a directory listing",
    "areal_node.constants.CHECKPOINT_FILE": "file names of a directory listing",
    "areal_node.prom_text._PAIR": "only inside the span _LABELS matched (a line of 8 KiB)",
    "areal_node.versions._REF": "fullmatch of a ref name read from 4 KB",
    "areal_console.core.stacks.pyspy_text._LINE_NUMBER": "fullmatch, {1,18} bounded",
}


ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ((ROOT / "tui", "areal_console/core"), (ROOT / "agents", "areal_node"))


@cache
def pattern_names() -> frozenset[str]:
    """Every module-level `NAME = re.compile(...)`, read from the source (importing every
    module would import torch)."""
    found = set()
    for top, package in PACKAGES:
        for path in (top / package).rglob("*.py"):
            parts = path.relative_to(top).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.parse(path.read_text()).body:
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "re.compile"
                ):
                    found |= {f"{module}.{t.id}" for t in node.targets if isinstance(t, ast.Name)}
    return frozenset(found)


def pattern(name: str) -> re.Pattern[Any]:
    module, _, attr = name.rpartition(".")
    value = getattr(importlib.import_module(module), attr)
    assert isinstance(value, re.Pattern)
    return value


@cache
def adversarial(unit: str, size: int, head: str = "") -> str:
    """`head`, `unit` repeated, and a tail when there is a head: `size` characters."""
    tail = "c" if head else ""
    body = size - len(head) - len(tail)
    return head + (unit * (body // len(unit) + 1))[:body] + tail


def cpu_seconds(work: Callable[[], object]) -> float:
    t0 = time.process_time()
    work()
    return time.process_time() - t0


def apply(pattern: re.Pattern[Any], how: str, text: str) -> None:
    data: Any = text.encode() if isinstance(pattern.pattern, bytes) else text
    if how == "line":
        pattern.match(data)
    elif how == "name":
        is_secret_name(data)
    else:
        for _ in pattern.finditer(data):
            pass


def timed(compiled: re.Pattern[Any], how: str, text: str) -> float:
    return cpu_seconds(lambda: apply(compiled, how, text))


def test_every_pattern_is_classified() -> None:
    found = pattern_names()
    unclassified = sorted(found - set(APPLIED) - set(NOT_JOB_TEXT))
    assert not unclassified, (
        f"say how each is applied (APPLIED) or why not (NOT_JOB_TEXT): {unclassified}"
    )
    assert not sorted((set(APPLIED) | set(NOT_JOB_TEXT)) - found), "stale names"


def test_every_applied_pattern_is_linear_on_adversarial_input() -> None:
    """Each pattern on each input (head, unit repeated, tail) at 16 KiB (a quadratic pattern is already 100
    times slower there than a linear one), then on its slowest input at 1 MiB, where the
    bound holds."""
    slow = {}
    for name, how in APPLIED.items():
        compiled = pattern(name)
        spent = {(h, u): timed(compiled, how, adversarial(u, SCREEN, h)) for h, u in INPUTS}
        worst = max(spent, key=lambda k: spent[k])
        full = timed(compiled, how, adversarial(worst[1], SIZE, worst[0]))
        if full > BOUND:
            slow[name] = (worst, round(full, 1))
    assert not slow, f"over {BOUND} s on 1 MiB (pattern: ((head, unit), seconds)): {slow}"


def test_the_reported_masking_case_is_fast() -> None:
    """`a: b`, 100,000 spaces, `c` (41 s before), and the whole masking and aliasing of a
    1 MiB log with thousands of known hosts."""
    line = "a: b" + " " * 100_000 + "c"
    redactor = Redactor(anonymize=True)
    redactor.learn_hosts(f"gpu-{i:04d}" for i in range(4096))
    assert cpu_seconds(lambda: (redactor.learn(line), redactor.text(line))) < BOUND
    log = adversarial("gpu-0007.x a: b  ", SIZE)
    assert cpu_seconds(lambda: redactor.text(log)) < 10 * BOUND


def test_the_check_tells_the_old_masking_pattern_from_the_new() -> None:
    """The measure itself: on `a: b`, 5,000 spaces, `c` the old YAML pattern (quadratic)
    is many times slower than the one that replaced it."""
    old = re.compile(r"^([ \t]*-?[ \t]*)([A-Za-z_][\w.-]*)([ \t]*:[ \t]+)(\S.*?)[ \t]*$", re.M)
    text = "a: b" + " " * 5_000 + "c"
    new = pattern("areal_console.core.report.redact.YAML")
    assert cpu_seconds(lambda: apply(old, "text", text)) > 50 * cpu_seconds(
        lambda: apply(new, "text", text)
    )
