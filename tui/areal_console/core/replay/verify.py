"""A replay with overrides (`actor.eps_clip=0.1`) is a changed run, not a reproduction.

Its loss and gradient norm are meant to differ from the recording, so they are not
compared. What the overrides leave unchanged still is: the reference trainer computes
`task_reward`, `seq_len` and `no_eos_ratio` from the dumped batch alone (before any
config value is read; reference_trainer.py `train_step`), so an override of training
keys only cannot change them, and a difference there means the replay did not read the
recorded batch. An override that may change which data is read (the step range, the
dump path, the dataset or generation config), or a template whose metrics the console
does not compute, leaves nothing known to be unchanged: the verification says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.replay.plan import Verification, format_steps, verify

# Metrics the reference trainer computes from the dumped batch alone.
BATCH_METRICS: tuple[str, ...] = ("task_reward", "seq_len", "no_eos_ratio")

# Override keys (the reference trainer's config) that change training, never the batch.
TRAINING_ONLY = ("actor.", "model.", "seed", "threads", "debug.", "stats_logger.")


def override_keys(overrides: Sequence[str]) -> list[str]:
    return [o.partition("=")[0].strip() for o in overrides]


def data_override(template: str, overrides: Sequence[str]) -> str | None:
    """Why the batch metrics of this changed run cannot be compared; None: they can."""
    if template != "reference":
        return f"the {template} template's metrics are not known to be independent of them"
    for key in override_keys(overrides):
        if not any(key == p or key.startswith(p) for p in TRAINING_ONLY):
            return f"{key} may change the data the replay reads"
    return None


def changed_run_note(template: str, overrides: Sequence[str]) -> str:
    """Before a changed run starts: what its verification will compare."""
    changed = f"overrides change the run ({' '.join(overrides)})"
    why = data_override(template, overrides)
    if why is not None:
        return f"{changed}: it will not be compared with the recording: {why}"
    return (
        f"{changed}: its loss and gradients are not compared with the recording; "
        f"{', '.join(BATCH_METRICS)} (read from the batch) are"
    )


@dataclass
class ChangedRunVerification(Verification):
    """A replay run with overrides, against the recording.

    `matched` is True when nothing differs that the overrides leave unchanged (also when
    nothing could be compared: `comparable` is then False); in JSON it is `null` unless a
    compared metric differs, since a changed run neither matches nor differs as a whole.
    """

    overrides: list[str] = field(default_factory=list)
    compared: list[str] = field(default_factory=list)

    @property
    def changed(self) -> str:
        return f"overrides change the run ({' '.join(self.overrides)})"

    @property
    def verdict(self) -> str:
        if not self.comparable:
            return "changed run"
        if self.matched:
            return "changed run; batch matches"
        m = self.first_mismatch or {}
        return f"changed run; batch differs at step {m.get('step')}"

    @property
    def summary(self) -> str:
        if self.saved_summary is not None:
            return self.saved_summary
        m = self.first_mismatch or {}
        if not self.comparable:
            return f"{self.changed}: not compared with the recording: {m.get('reason')}"
        how = "bit for bit" if self.tolerance is None else f"within {self.tolerance:g}"
        names = ", ".join(self.compared)
        if self.matched:
            return (
                f"{self.changed}: loss and gradients not compared; what they leave unchanged "
                f"matches the recording ({names}, steps {format_steps(self.steps)}, {how})"
            )
        what = m.get("reason") or (
            f"{m.get('metric')} recorded {m.get('recorded')!r}, replayed {m.get('replayed')!r}"
        )
        return (
            f"{self.changed}, yet what they leave unchanged differs from the recording at "
            f"step {m.get('step')}: {what} ({how}): the replay did not read the recorded batch"
        )

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["matched"] = False if self.comparable and not self.matched else None
        data["overrides"] = list(self.overrides)
        data["compared"] = list(self.compared)
        return data


def verify_changed_run(
    recorded: dict[int, dict[str, Any]],
    replayed: dict[int, dict[str, Any]],
    steps: tuple[int, int],
    template: str,
    overrides: Sequence[str],
    rel_tol: float | None = None,
) -> ChangedRunVerification:
    """Compare what `overrides` leave unchanged, or say why nothing is."""
    why = data_override(template, overrides)
    if why is not None:
        return ChangedRunVerification(
            True, [], {"step": steps[0], "metric": None, "recorded": None, "replayed": None,
                       "reason": why}, tolerance=rel_tol, comparable=False,
            overrides=list(overrides),
        )  # fmt: skip
    result = verify(recorded, replayed, steps, metrics=BATCH_METRICS, rel_tol=rel_tol)
    return ChangedRunVerification(
        result.matched,
        result.steps,
        result.first_mismatch,
        tolerance=rel_tol,
        comparable=result.comparable,
        overrides=list(overrides),
        compared=list(BATCH_METRICS),
    )


def verification_from_json(raw: Any) -> Verification | None:
    """A saved verification, a changed run's as one (it names its overrides)."""
    base = Verification.from_json(raw)
    if base is None or not isinstance(raw, Mapping) or not raw.get("overrides"):
        return base
    overrides, compared = raw.get("overrides"), raw.get("compared")
    return ChangedRunVerification(
        raw.get("matched") is not False,
        base.steps,
        base.first_mismatch,
        tolerance=base.tolerance,
        comparable=base.comparable,
        saved_summary=base.saved_summary,
        overrides=[str(o) for o in overrides] if isinstance(overrides, list) else [],
        compared=[str(c) for c in compared] if isinstance(compared, list) else [],
    )


def failed(verification: Verification) -> bool:
    """Whether a verification says the replay went wrong (a changed run: only when what
    its overrides leave unchanged differs)."""
    if isinstance(verification, ChangedRunVerification):
        return verification.comparable and not verification.matched
    return not verification.matched
