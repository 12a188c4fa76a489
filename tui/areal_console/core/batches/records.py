"""Typed records of the batch results the Batches screen shows.

`batches.py` answers with JSON-able dicts (it runs on nodes too, next to the dump, and
`batch --json` prints them as they are). The screen's workers convert each answer here
once, so the screen reads attributes and never looks up keys. A missing value or one of
the wrong type becomes None (the screen shows `-`): a newer or odd agent cannot crash the
view. Numbers keep their own type (an int stays an int): the screen prints them as they
came.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.connection.records import _int, _number, _text


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _numbers(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(v for v in value if _number(v) is not None)


@dataclass(frozen=True, slots=True)
class Histogram:
    """`batches.histogram`: counts over equal-width bins between the edges."""

    edges: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()

    @classmethod
    def from_json(cls, raw: Any) -> Histogram | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(edges=_numbers(raw.get("edges")), counts=_numbers(raw.get("counts")))


@dataclass(frozen=True, slots=True)
class Describe:
    """`batches.describe`: mean, std, min and max of one per-sample value."""

    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Describe | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(
            mean=_number(raw.get("mean")),
            std=_number(raw.get("std")),
            min=_number(raw.get("min")),
            max=_number(raw.get("max")),
        )


@dataclass(frozen=True, slots=True)
class VersionStats:
    """Policy versions of a batch: range, staleness behind the newest, mixed-version rows."""

    min: int | None = None
    max: int | None = None
    staleness_mean: float | None = None
    staleness_max: float | None = None
    mixed_version_ratio: float | None = None

    @classmethod
    def from_json(cls, raw: Any) -> VersionStats | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(
            min=_int(raw.get("min")),
            max=_int(raw.get("max")),
            staleness_mean=_number(raw.get("staleness_mean")),
            staleness_max=_number(raw.get("staleness_max")),
            mixed_version_ratio=_number(raw.get("mixed_version_ratio")),
        )


@dataclass(frozen=True, slots=True)
class ImportanceWeights:
    """The behaviour importance weight (prox_logp vs logprobs) over a batch's tokens."""

    mean: float | None = None
    min: float | None = None
    max: float | None = None
    upper: float | None = None
    above_upper_ratio: float | None = None

    @classmethod
    def from_json(cls, raw: Any) -> ImportanceWeights | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(
            mean=_number(raw.get("mean")),
            min=_number(raw.get("min")),
            max=_number(raw.get("max")),
            upper=_number(raw.get("upper")),
            above_upper_ratio=_number(raw.get("above_upper_ratio")),
        )


@dataclass(frozen=True, slots=True)
class BatchStats:
    """`batches.batch_stats`: a batch's per-sample statistics, named as AReaL names them."""

    seq_len: Describe | None = None
    prompt_len: Describe | None = None
    response_len: Describe | None = None
    task_reward: Describe | None = None
    reward: Describe | None = None
    no_eos_ratio: float | None = None
    no_eos_token_ratio: float | None = None
    equal_reward_group_ratio: float | None = None
    equal_reward_groups: int = 0
    version: VersionStats | None = None
    behave_imp_weight: ImportanceWeights | None = None

    @classmethod
    def from_json(cls, raw: Any) -> BatchStats | None:
        """None for no stats (a file that is not a batch has an empty `stats`)."""
        if not isinstance(raw, Mapping) or not raw:
            return None
        return cls(
            seq_len=Describe.from_json(raw.get("seq_len")),
            prompt_len=Describe.from_json(raw.get("prompt_len")),
            response_len=Describe.from_json(raw.get("response_len")),
            task_reward=Describe.from_json(raw.get("task_reward")),
            reward=Describe.from_json(raw.get("reward")),
            no_eos_ratio=_number(raw.get("no_eos_ratio")),
            no_eos_token_ratio=_number(raw.get("no_eos_token_ratio")),
            equal_reward_group_ratio=_number(raw.get("equal_reward_group_ratio")),
            equal_reward_groups=_int(raw.get("equal_reward_groups")) or 0,
            version=VersionStats.from_json(raw.get("version")),
            behave_imp_weight=ImportanceWeights.from_json(raw.get("behave_imp_weight")),
        )

    def describe(self, name: str) -> Describe | None:
        """One of seq_len, prompt_len, response_len, task_reward, reward."""
        value = getattr(self, name, None) if name in _DESCRIBED else None
        return value if isinstance(value, Describe) else None


_DESCRIBED = frozenset({"seq_len", "prompt_len", "response_len", "task_reward", "reward"})


@dataclass(frozen=True, slots=True)
class RemoteShards:
    """Where a batch of RTensor references keeps its data: shards per node address."""

    nodes: Mapping[str, int]
    shards: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> RemoteShards | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        nodes = {
            str(k): n for k, v in _mapping(raw.get("nodes")).items() if (n := _int(v)) is not None
        }
        return cls(nodes=nodes, shards=_int(raw.get("shards")))


@dataclass(frozen=True, slots=True)
class StepEntry:
    """One step file of a dump directory's timeline (a row of the steps table)."""

    file: str | None = None  # the name in the dump directory; None: the dump is one file
    step: int | None = None
    dp_rank: int | None = None
    bytes: int | None = None
    analyzed: bool | None = None  # False: older than the newest steps the summary reads
    error: str | None = None  # why the file adds nothing to the summary
    format: str | None = None
    groups: int | None = None
    samples: int | None = None
    tokens: int | None = None
    seq_len_mean: float | None = None
    response_len_mean: float | None = None
    task_reward_mean: float | None = None
    no_eos_ratio: float | None = None
    no_eos_token_ratio: float | None = None
    equal_reward_group_ratio: float | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> StepEntry:
        return cls(
            file=_text(raw.get("file")),
            step=_int(raw.get("step")),
            dp_rank=_int(raw.get("dp_rank")),
            bytes=_int(raw.get("bytes")),
            analyzed=_bool(raw.get("analyzed")),
            error=_text(raw.get("error")),
            format=_text(raw.get("format")),
            groups=_int(raw.get("groups")),
            samples=_int(raw.get("samples")),
            tokens=_int(raw.get("tokens")),
            seq_len_mean=_number(raw.get("seq_len_mean")),
            response_len_mean=_number(raw.get("response_len_mean")),
            task_reward_mean=_number(raw.get("task_reward_mean")),
            no_eos_ratio=_number(raw.get("no_eos_ratio")),
            no_eos_token_ratio=_number(raw.get("no_eos_token_ratio")),
            equal_reward_group_ratio=_number(raw.get("equal_reward_group_ratio")),
        )


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """`batches.summarize` of a dump file or directory (`batch --json`)."""

    path: str
    format: str | None = None
    description: str = ""
    step: int | None = None
    dp_rank: int | None = None
    groups: int | None = None
    samples: int | None = None
    tokens: int | None = None  # None: unknown (RTensor references)
    eos_token_ids: tuple[int, ...] | None = None
    stats: BatchStats | None = None
    warnings: tuple[str, ...] = ()
    # `distributions`: per-sample histograms (the summary pane shows two of them).
    task_reward_hist: Histogram | None = None
    response_len_hist: Histogram | None = None
    seq_len_hist: Histogram | None = None
    remote: RemoteShards | None = None
    timeline: tuple[StepEntry, ...] = ()  # a dump directory's step files

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BatchSummary:
        eos = raw.get("eos_token_ids")
        dist = _mapping(raw.get("distributions"))
        timeline = raw.get("timeline")
        warnings = raw.get("warnings")
        return cls(
            path=str(raw.get("path") or ""),
            format=_text(raw.get("format")),
            description=str(raw.get("description") or ""),
            step=_int(raw.get("step")),
            dp_rank=_int(raw.get("dp_rank")),
            groups=_int(raw.get("groups")),
            samples=_int(raw.get("samples")),
            tokens=_int(raw.get("tokens")),
            eos_token_ids=(
                tuple(i for i in eos if _int(i) is not None) if isinstance(eos, list) else None
            ),
            stats=BatchStats.from_json(raw.get("stats")),
            warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else (),
            task_reward_hist=Histogram.from_json(dist.get("task_reward")),
            response_len_hist=Histogram.from_json(dist.get("response_len")),
            seq_len_hist=Histogram.from_json(dist.get("seq_len")),
            remote=RemoteShards.from_json(raw.get("remote")),
            timeline=(
                tuple(StepEntry.from_json(e) for e in timeline if isinstance(e, Mapping))
                if isinstance(timeline, list)
                else ()
            ),
        )

    def as_step(self) -> StepEntry:
        """The one row of the steps table for a dump that is a single file."""
        st = self.stats
        resp = st.response_len if st else None
        task = st.task_reward if st else None
        return StepEntry(
            file=None,
            step=self.step,
            dp_rank=self.dp_rank,
            samples=self.samples,
            response_len_mean=resp.mean if resp else None,
            task_reward_mean=task.mean if task else None,
            no_eos_ratio=st.no_eos_ratio if st else None,
        )


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One sample of a step file (`batches.sample_table` rows): a row of the samples table."""

    index: int
    group: int | None = None
    row: int | None = None
    task_id: str | None = None  # text rollouts only
    seq_len: int | None = None
    prompt_len: int | None = None
    response_len: int | None = None
    task_reward: float | None = None
    reward: float | None = None
    no_eos: bool | None = None  # AReaL's rule: the length reaches the padded width
    eos: bool | None = None  # by the EOS id, when it is known
    head_version: int | None = None
    tail_version: int | None = None
    # Every value of the record as it came, as text: what a plain-text filter matches.
    text_values: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SampleRow | None:
        """The row of one sample record; None for a record without an index."""
        index = _int(raw.get("index"))
        if index is None:
            return None
        return cls(
            index=index,
            group=_int(raw.get("group")),
            row=_int(raw.get("row")),
            task_id=_text(raw.get("task_id")),
            seq_len=_int(raw.get("seq_len")),
            prompt_len=_int(raw.get("prompt_len")),
            response_len=_int(raw.get("response_len")),
            task_reward=_number(raw.get("task_reward")),
            reward=_number(raw.get("reward")),
            no_eos=_bool(raw.get("no_eos")),
            eos=_bool(raw.get("eos")),
            head_version=_int(raw.get("head_version")),
            tail_version=_int(raw.get("tail_version")),
            text_values=tuple(str(v) for v in raw.values()),
        )

    @property
    def ends_in_eos(self) -> bool | None:
        """By the EOS id when known, else AReaL's rule (not cut at the padded width)."""
        if self.eos is not None:
            return self.eos
        return None if self.no_eos is None else not self.no_eos

    def value(self, name: str) -> Any:
        """A field by name (a filter's `key=value`); None for a name that is no field."""
        return getattr(self, name) if name in _SAMPLE_FIELDS else None


# The fields a `key=value` filter term can name.
_SAMPLE_FIELDS = frozenset(f.name for f in dataclasses.fields(SampleRow) if f.name != "text_values")


def sample_rows(table: Mapping[str, Any]) -> tuple[SampleRow, ...]:
    """A `batches.sample_table` answer's rows (records without an index are left out)."""
    raw = table.get("rows")
    if not isinstance(raw, list):
        return ()
    rows = (SampleRow.from_json(r) for r in raw if isinstance(r, Mapping))
    return tuple(r for r in rows if r is not None)


def _ints(value: Any) -> tuple[int, ...] | None:
    """A per-token list of ints (token ids), or None when it is not one."""
    if not isinstance(value, list) or not all(_int(v) is not None for v in value):
        return None
    return tuple(value)


@dataclass(frozen=True, slots=True)
class SampleView:
    """`batches.sample_view`: one sample unpadded, token by token (the sample pane)."""

    index: int | None = None
    group: int | None = None
    row: int | None = None
    seq_len: int | None = None
    prompt_len: int | None = None
    response_len: int | None = None
    task_reward: float | None = None  # the reward when the dump has no task reward
    eos: bool | None = None
    head_version: int | None = None
    tail_version: int | None = None
    # The group's non-tensor entries for this sample (task_id, loss weights ...), as short
    # JSON values: shown as they came.
    extras: Mapping[str, Any] = field(default_factory=dict)
    tokens: tuple[int, ...] | None = None  # None: a text rollout (prompt and completion)
    loss_mask: tuple[bool, ...] | None = None  # per token: completion (True) or prompt
    logprobs: tuple[float | None, ...] | None = None
    versions: tuple[int | None, ...] | None = None  # per token: the policy version
    text: str | None = None  # the decoded tokens, when a tokenizer was found
    prompt: str | None = None  # text rollouts
    completion: str | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SampleView:
        mask = raw.get("loss_mask")
        logprobs = raw.get("logprobs")
        versions = raw.get("versions")
        return cls(
            index=_int(raw.get("index")),
            group=_int(raw.get("group")),
            row=_int(raw.get("row")),
            seq_len=_int(raw.get("seq_len")),
            prompt_len=_int(raw.get("prompt_len")),
            response_len=_int(raw.get("response_len")),
            task_reward=_number(raw.get("task_reward", raw.get("reward"))),
            eos=_bool(raw.get("eos")),
            head_version=_int(raw.get("head_version")),
            tail_version=_int(raw.get("tail_version")),
            extras=dict(_mapping(raw.get("extras"))),
            tokens=_ints(raw.get("tokens")),
            loss_mask=tuple(bool(m) for m in mask) if isinstance(mask, list) else None,
            logprobs=tuple(map(_number, logprobs)) if isinstance(logprobs, list) else None,
            versions=tuple(map(_int, versions)) if isinstance(versions, list) else None,
            text=_text(raw.get("text")),
            prompt=_text(raw.get("prompt") or None),
            completion=_text(raw.get("completion") or None),
        )


@dataclass(frozen=True, slots=True)
class CompareRow:
    """One statistic of two summaries side by side."""

    stat: str
    a: float | None = None
    b: float | None = None
    delta: float | None = None  # b - a


@dataclass(frozen=True, slots=True)
class Comparison:
    """`batches.compare` of two summaries."""

    a: str | None
    b: str | None
    rows: tuple[CompareRow, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Comparison:
        rows = raw.get("rows")
        return cls(
            a=_text(raw.get("a")),
            b=_text(raw.get("b")),
            rows=tuple(
                CompareRow(
                    stat=str(r.get("stat") or ""),
                    a=_number(r.get("a")),
                    b=_number(r.get("b")),
                    delta=_number(r.get("delta")),
                )
                for r in (rows if isinstance(rows, list) else ())
                if isinstance(r, Mapping)
            ),
        )
