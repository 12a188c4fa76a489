"""One formatter for batch figures: the CLI's text and the Batches screen agree."""

from __future__ import annotations

from areal_console.commands.batch import format_summary
from areal_console.core.batches.formatter import figure, figure_as, size
from areal_console.screens.batches import summary_text


def test_figures_read_the_same_everywhere() -> None:
    assert figure(None) == "-"
    assert figure(123456) == "123,456"
    assert figure(1.0, 3) == "1.000"  # a measured value keeps its decimals
    assert figure(0.0, 3) == "0.000"
    assert figure(2.25) == "2.2"  # round half to even, as format() does
    assert figure(12345.678, 2) == "12,345.68"
    assert figure(True) == "True"
    assert figure_as(None, ".0%") == "-"
    assert figure_as(0.5, ".0%") == "50%"


def test_sizes_use_the_consoles_units() -> None:
    assert size(None) == "-"
    assert size(512) == "512B"
    assert size(3 * 1024 * 1024 // 2) == "1.5M"


def test_cli_and_screen_show_a_summarys_counts_alike() -> None:
    from areal_console.core.batches.records import BatchSummary

    fields = dict(path="/d/step.pt", description="a batch", groups=1200, samples=4800)
    doc = {**fields, "tokens": 1234567, "bytes": 2048, "step": 3, "dp_rank": 1}
    cli = format_summary(doc)
    assert "groups 1,200  samples 4,800  tokens 1,234,567" in cli
    assert "2K" in cli
    summary = BatchSummary.from_json(doc)
    screen = summary_text(summary).plain
    assert "groups 1,200  samples 4,800  tokens 1,234,567" in screen
