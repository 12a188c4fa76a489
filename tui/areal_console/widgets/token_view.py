"""One sample's tokens: prompt vs completion by loss mask, logprob shading, version marks."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from areal_console.core.batches.records import SampleView
from areal_console.widgets.remote_text import remote_block, remote_text

MAX_TOKENS = 4000  # a view, not an export: very long samples are cut with a note


def logprob_style(logprob: float | None) -> str:
    """Completion tokens: green when likely, amber when unsure, red when surprising."""
    if logprob is None:
        return "bold"
    if logprob > -0.5:
        return "black on green"
    if logprob > -2.0:
        return "black on yellow"
    return "white on red"


def sample_text(view: SampleView, detailed: bool = False) -> Text:
    """A rich rendering of a `batches.sample_view` result.

    `detailed` writes each completion token as `id:logprob` instead of only shading it.
    """
    out = Text()
    eos = view.eos
    out.append(
        f"sample {view.index}  group {view.group} row {view.row}  "
        f"seq {view.seq_len}  prompt {view.prompt_len}  response {view.response_len}  "
        f"task_reward {view.task_reward}  "
        f"eos {'-' if eos is None else 'yes' if eos else 'NO'}  "
        f"versions {view.head_version}..{view.tail_version}\n",
        style="bold",
    )
    for name, value in view.extras.items():
        out.append_text(remote_text(f"{name}: {value}", style="dim"))
        out.append("\n")
    tokens = view.tokens
    if tokens is None:
        out.append("prompt\n", style="bold dim")
        out.append_text(remote_block(f"{view.prompt or ''}\n", style="dim"))
        out.append("completion\n", style="bold")
        out.append_text(remote_block(f"{view.completion or ''}\n"))
        return out
    # Separators end the preceding segment: a segment's leading spaces can be dropped.
    out.append("legend: prompt,", style="dim")
    out.append(" completion by logprob: ")
    out.append("likely", style=logprob_style(-0.1))
    out.append(" ")
    out.append("unsure", style=logprob_style(-1.0))
    out.append(" ")
    out.append("surprising", style=logprob_style(-3.0))
    out.append(", ")
    out.append("«vN»", style="bold magenta")
    out.append(" = policy version from here on\n", style="dim")
    if view.text:
        out.append_text(remote_block(view.text + "\n\n"))
    mask = view.loss_mask or (False,) * len(tokens)
    logprobs = view.logprobs
    versions = view.versions
    current: int | None = None
    for i, tok in enumerate(tokens[:MAX_TOKENS]):
        completion = i < len(mask) and mask[i]
        if versions is not None and completion and i < len(versions) and versions[i] != current:
            current = versions[i]
            out.append(f"«v{current}»", style="bold magenta")
        lp = logprobs[i] if logprobs and i < len(logprobs) else None
        style = logprob_style(lp) if completion else "dim"
        label = f"{tok}:{lp:.2f}" if detailed and completion and lp is not None else str(tok)
        out.append_text(remote_text(label, style=style))
        out.append(" ")
    if len(tokens) > MAX_TOKENS:
        out.append(f"\n… {len(tokens) - MAX_TOKENS} more tokens", style="dim")
    return out


class TokenView(Static):
    """The sample view of the Batches screen."""

    DEFAULT_CSS = """
    TokenView { height: auto; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("select a sample (enter)", **kwargs)
        self.view: SampleView | None = None
        self.detailed = False

    def show(self, view: SampleView) -> None:
        self.view = view
        self.update(sample_text(view, self.detailed))

    def toggle_detail(self) -> None:
        """Switch between shaded token ids and `id:logprob` labels."""
        self.detailed = not self.detailed
        if self.view is not None:
            self.update(sample_text(self.view, self.detailed))
