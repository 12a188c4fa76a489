"""Two batch summaries side by side."""

from __future__ import annotations

from typing import Any


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Side-by-side numbers of two summaries: rows of (stat, a, b, delta)."""
    rows = []
    for top in ("groups", "samples", "tokens"):
        rows.append(_compare_row(top, a.get(top), b.get(top)))
    sa, sb = a.get("stats") or {}, b.get("stats") or {}
    for name in ("seq_len", "prompt_len", "response_len", "task_reward"):
        for part in ("mean", "std", "min", "max"):
            rows.append(
                _compare_row(
                    f"{name}.{part}", (sa.get(name) or {}).get(part), (sb.get(name) or {}).get(part)
                )
            )
    for name in ("no_eos_ratio", "no_eos_token_ratio", "equal_reward_group_ratio"):
        rows.append(_compare_row(name, sa.get(name), sb.get(name)))
    for part in ("staleness_mean", "staleness_max"):
        rows.append(
            _compare_row(
                f"version.{part}",
                (sa.get("version") or {}).get(part),
                (sb.get("version") or {}).get(part),
            )
        )
    rows.append(
        _compare_row(
            "behave_imp_weight.mean",
            (sa.get("behave_imp_weight") or {}).get("mean"),
            (sb.get("behave_imp_weight") or {}).get("mean"),
        )
    )
    return {"a": a.get("path"), "b": b.get("path"), "rows": rows}


def _compare_row(stat: str, x: Any, y: Any) -> dict[str, Any]:
    delta = y - x if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
    return {"stat": stat, "a": x, "b": y, "delta": delta}
