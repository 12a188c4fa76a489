"""Metric series by step, stored compactly.

A log's stats tables keep the same keys step after step, so they are stored as blocks: one
layout (the ordered names) and a flat row-major `array('d')` of values, appended in C. A
series is a strided slice of each block. Scalars from tensorboard arrive one by one and
go to per-name arrays.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Block:
    names: tuple[str, ...]
    index: dict[str, int]
    steps: array = field(default_factory=lambda: array("q"))
    values: array = field(default_factory=lambda: array("d"))


class MetricStore:
    """Every metric's (step, value) points, in the order the run logged them."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._scalars: dict[str, tuple[array, array]] = {}
        self._names: dict[str, None] = {}
        self.steps: array = array("q")  # every step seen, in order
        self.step_times: array = array("d")  # wall time of each step (nan if unknown)

    # writing --------------------------------------------------------------------------
    def add_row(self, step: int, names: tuple[str, ...], values: Sequence[float]) -> None:
        """One step's table: `names` in table order, one value each."""
        block = self._block_for(names)
        block.steps.append(step)
        block.values.extend(values)

    def add_rows(self, steps: Sequence[int], names: tuple[str, ...], values: memoryview) -> None:
        """Several steps' tables of one layout: `values` (the bytes of C doubles) row after
        row, in `names` order."""
        if not steps:
            return
        block = self._block_for(names)
        block.steps.extend(steps)
        block.values.frombytes(values)

    def _block_for(self, names: tuple[str, ...]) -> Block:
        """The block rows of this layout go to: the last one, or a new one."""
        block = self.blocks[-1] if self.blocks else None
        if block is None or block.names != names:
            block = Block(names, {n: i for i, n in enumerate(names)})
            self.blocks.append(block)
            for n in names:
                self._names.setdefault(n, None)
        return block

    def add_scalar(self, name: str, step: int, value: float) -> None:
        pair = self._scalars.get(name)
        if pair is None:
            pair = self._scalars[name] = (array("q"), array("d"))
            self._names.setdefault(name, None)
        pair[0].append(step)
        pair[1].append(value)

    def mark_step(self, step: int, at: float) -> None:
        self.steps.append(step)
        self.step_times.append(at)

    def mark_steps(self, steps: Sequence[int], times: Sequence[float]) -> None:
        self.steps.extend(steps)
        self.step_times.extend(times)

    # reading --------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric (empty lists if the run never logged it)."""
        steps: list[int] = []
        values: list[float] = []
        for block in list(self.blocks):
            j = block.index.get(name)
            if j is None:
                continue
            width = len(block.names)
            # Another thread may be appending: take only complete rows.
            n = min(len(block.steps), len(block.values) // width)
            steps.extend(block.steps[:n])
            values.extend(block.values[j : n * width : width])
        pair = self._scalars.get(name)
        if pair is not None:
            n = min(len(pair[0]), len(pair[1]))
            steps.extend(pair[0][:n])
            values.extend(pair[1][:n])
        return steps, values

    def latest(self, name: str) -> float | None:
        pair = self._scalars.get(name)
        if pair is not None and pair[1]:
            return pair[1][-1]
        for block in reversed(self.blocks):
            j = block.index.get(name)
            if j is not None and block.steps:
                return block.values[(len(block.steps) - 1) * len(block.names) + j]
        return None

    def all_steps(self) -> list[int]:
        """The distinct steps with any data, ascending."""
        seen: set[int] = set(self.steps)
        for block in self.blocks:
            seen.update(block.steps)
        for steps, _ in self._scalars.values():
            seen.update(steps)
        return sorted(seen)
