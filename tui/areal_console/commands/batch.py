"""`areal-console batch PATH`: summarize a dumped rollout batch, a dump directory, or one sample."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from areal_node.batches import BATCH_FORMATS, BatchError, compare

from areal_console.commands.options import target_options
from areal_console.core.batches.formatter import figure, size
from areal_console.core.batches.source import BatchSource, LocalBatchSource, RemoteBatchSource
from areal_console.core.common.errors import EXIT_OK, EXIT_PARTIAL, UsageError, UserError
from areal_console.core.targets.resolve import (
    add_target_arguments,
    index,
    names_remote_nodes,
    open_fleet,
    resolve_targets,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="summarize a dumped rollout batch (.pt), a dump directory, or one sample",
        description=(
            "Open AReaL rollout dumps safely (weights_only, memory-mapped): a step_NNNNNN.pt "
            "file, a dump directory (steps x dp ranks), a dict batch, or a rollout/ text dump."
        ),
    )
    parser.add_argument("path", metavar="PATH", help="a .pt file or a dump directory")
    parser.add_argument("--sample", type=index, metavar="I", help="show sample I (0-based)")
    parser.add_argument(
        "--step",
        type=int,
        metavar="N",
        help="in a directory: the step for --sample (default: the newest)",
    )
    parser.add_argument(
        "--dp-rank",
        type=int,
        metavar="K",
        help="in a directory: the dp rank for --sample (default: the lowest)",
    )
    parser.add_argument(
        "--compare",
        metavar="OTHER",
        help="compare PATH with another file or directory side by side",
    )
    parser.add_argument(
        "--eos-token-id",
        type=int,
        metavar="N",
        help="EOS token id for the EOS-based no_eos_token_ratio (default: from the model's "
        "config files next to the dump or named by the experiment's config.yaml)",
    )
    parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow pickled objects that can run code (only for files you trust)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--node",
        metavar="NAME",
        help="read PATH on this node (through its agent) instead of locally",
    )
    add_target_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    source, fleet = _source(args)
    try:
        return _run(args, source)
    except BatchError as exc:
        raise UserError(str(exc)) from None
    finally:
        if fleet is not None:
            fleet.close()


def _source(args: argparse.Namespace) -> tuple[BatchSource, Any]:
    if args.node is None and not names_remote_nodes(target_options(args)):
        return LocalBatchSource(), None
    specs = resolve_targets(target_options(args))
    if args.node is None:
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise UsageError(f"the targets name {len(specs)} nodes ({names}): pick one with --node")
        spec = specs[0]
    else:
        matches = [s for s in specs if args.node in (s.name, s.host)]
        if (
            not matches
            and len(specs) == 1
            and specs[0].transport == "local"
            and args.node in ("local", "localhost")
        ):
            matches = specs
        if not matches:
            names = ", ".join(s.name for s in specs)
            raise UsageError(f"no node named {args.node!r} among the targets ({names})")
        spec = matches[0]
    fleet = open_fleet(target_options(args), [spec])
    return RemoteBatchSource(fleet.sessions[0]), fleet


def _run(args: argparse.Namespace, source: BatchSource) -> int:
    opts = {"eos_token_id": args.eos_token_id, "trust_pickle": args.trust_pickle}
    if args.sample is not None:
        view = source.sample(args.path, args.sample, step=args.step, dp_rank=args.dp_rank, **opts)
        _emit(view, args.json, format_sample)
        return 0
    summary = source.summary(args.path, **opts)
    if summary["format"] not in BATCH_FORMATS:
        raise UserError(f"{args.path} is not a rollout batch: it is {summary['description']}")
    if args.compare:
        other = source.summary(args.compare, **opts)
        if other["format"] not in BATCH_FORMATS:
            raise UserError(f"{args.compare} is not a rollout batch: it is {other['description']}")
        _emit(compare(summary, other), args.json, format_compare)
        return 0
    _emit(summary, args.json, format_summary)
    # A directory whose files partly failed to load: the rest is summarised (exit 3).
    failed = [e for e in summary.get("timeline") or [] if e.get("unreadable")]
    for e in failed:
        print(f"warning: {e['error']}", file=sys.stderr)
    return EXIT_PARTIAL if failed else EXIT_OK


def _emit(data: dict[str, Any], as_json: bool, fmt: Any) -> None:
    if as_json:
        json.dump(data, sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(fmt(data))


# --------------------------------------------------------------------------------------
# Text output


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['path']}: {s['description']}"]
    where = []
    if s.get("step") is not None:
        where.append(f"step {s['step']}")
    if s.get("dp_rank") is not None:
        where.append(f"dp rank {s['dp_rank']}")
    if s.get("bytes") is not None:
        where.append(size(s["bytes"]))
    where += [
        f"groups {figure(s['groups'])}",
        f"samples {figure(s['samples'])}",
        f"tokens {figure(s['tokens'])}",
    ]
    lines.append("  " + "  ".join(where))
    if s.get("eos_token_ids"):
        lines.append(
            f"  EOS id {', '.join(map(str, s['eos_token_ids']))} (from {s.get('eos_source')})"
        )
    if s.get("per_step"):
        lines.append("")
        lines.append(
            f"  {'step':>6} {'files':>5} {'samples':>8} {'seq_len':>8} "
            f"{'resp_len':>8} {'task_rw':>7} {'no_eos':>7}"
        )
        for p in s["per_step"]:
            lines.append(
                f"  {p['step']:>6} {p['files']:>5} {figure(p['samples']):>8} "
                f"{figure(p['seq_len_mean']):>8} {figure(p['response_len_mean']):>8} "
                f"{figure(p['task_reward_mean'], 3):>7} {figure(p['no_eos_ratio'], 3):>7}"
            )
        bad = [e for e in s.get("timeline", []) if e.get("error")]
        for e in bad:
            lines.append(f"  ! {e['file']}: {e['error']}")
    if s.get("keys"):
        lines.append("")
        lines.append("  keys")
        for name, meta in s["keys"].items():
            extra = (
                f"  (missing in {meta['missing_in_groups']} groups)"
                if meta.get("missing_in_groups")
                else ""
            )
            value = f"  = {meta['value']!r}" if "value" in meta else ""
            lines.append(f"    {name:<18} {meta['dtype']:<9} {meta['shape']}{value}{extra}")
    st = s.get("stats") or {}
    if st:
        lines.append("")
        lines.append(f"  {'stat':<14} {'mean':>10} {'std':>10} {'min':>10} {'max':>10}")
        names = ["seq_len", "prompt_len", "response_len", "task_reward"]
        if st.get("reward") and st.get("reward") != st.get("task_reward"):
            names.append("reward")  # the (normalised) rewards beside original_rewards
        for name in names:
            d = st.get(name) or {}
            digits = 3 if name in ("task_reward", "reward") else 1
            lines.append(
                f"  {name:<14} {figure(d.get('mean'), digits):>10} "
                f"{figure(d.get('std'), digits):>10} {figure(d.get('min'), digits):>10} "
                f"{figure(d.get('max'), digits):>10}"
            )
        eos_ids = s.get("eos_token_ids")
        lines.append(
            f"  no_eos_ratio   {figure(st.get('no_eos_ratio'), 3)}  (length == padded width)"
            + (
                f"   not ending in EOS {figure(st.get('no_eos_token_ratio'), 3)}"
                if eos_ids
                else "   (EOS id unknown: --eos-token-id N for the EOS-based figure)"
            )
        )
        if st.get("equal_reward_group_ratio") is not None:
            lines.append(
                f"  all-equal reward groups  {st.get('equal_reward_groups')} "
                f"({st['equal_reward_group_ratio']:.0%})"
            )
        v = st.get("version")
        if v:
            lines.append(
                f"  versions {v['min']}..{v['max']}  staleness mean "
                f"{v['staleness_mean']:.2f} max {v['staleness_max']}  "
                f"mixed-version samples {v['mixed_version_ratio']:.0%}"
            )
        iw = st.get("behave_imp_weight")
        if iw:
            lines.append(
                f"  behave_imp_weight mean {iw['mean']:.3f} min {iw['min']:.3f} "
                f"max {iw['max']:.3f} above {iw['upper']:g} {iw['above_upper_ratio']:.2%} "
                f"({figure(iw['tokens'])} tokens{', sampled' if iw['sampled'] else ''})"
            )
    if s.get("remote"):
        lines.append("")
        lines.append(f"  RTensor shards {s['remote']['shards']} on workers:")
        lines += [f"    {addr}  {n}" for addr, n in sorted(s["remote"]["nodes"].items())]
    if s.get("warnings"):
        lines.append("")
        lines.append("  warnings")
        lines += [f"  ! {w}" for w in s["warnings"]]
    return "\n".join(lines) + "\n"


def format_sample(v: dict[str, Any]) -> str:
    lines = [
        f"sample {v['index']} (group {v['group']}, row {v['row']}) of {v['path']}",
        f"  seq_len {v['seq_len']}  prompt_len {v['prompt_len']}  response_len "
        f"{v['response_len']}  task_reward {figure(v.get('task_reward'), 3)}  eos "
        f"{'-' if v.get('eos') is None else 'yes' if v['eos'] else 'NO'}  versions "
        f"{figure(v.get('head_version'))}..{figure(v.get('tail_version'))}",
    ]
    for name, value in (v.get("extras") or {}).items():
        lines.append(f"  {name}: {value}")
    if v.get("prompt") is not None or v.get("completion") is not None:
        lines += [
            "",
            "  prompt:",
            f"    {v.get('prompt')}",
            "  completion:",
            f"    {v.get('completion')}",
        ]
        return "\n".join(lines) + "\n"
    tokens = v.get("tokens") or []
    mask = v.get("loss_mask") or [0] * len(tokens)
    logp = v.get("logprobs")
    prompt = [t for t, m in zip(tokens, mask, strict=False) if not m]
    completion = [t for t, m in zip(tokens, mask, strict=False) if m]
    if v.get("text"):
        lines += ["", "  text:", *("    " + ln for ln in v["text"].splitlines())]
    lines += [
        "",
        f"  prompt tokens ({len(prompt)}): {_ids(prompt)}",
        f"  completion tokens ({len(completion)}): {_ids(completion)}",
    ]
    if logp is not None and completion:
        lp = [x for x, m in zip(logp, mask, strict=False) if m]
        lines.append(f"  completion logprob mean {sum(lp) / len(lp):.3f} min {min(lp):.3f}")
    return "\n".join(lines) + "\n"


def _ids(ids: list[int], limit: int = 40) -> str:
    text = " ".join(map(str, ids[:limit]))
    return text + (f" ... (+{len(ids) - limit})" if len(ids) > limit else "")


def format_compare(c: dict[str, Any]) -> str:
    lines = [f"A {c['a']}", f"B {c['b']}", "", f"  {'stat':<26} {'A':>12} {'B':>12} {'B-A':>12}"]
    for r in c["rows"]:
        lines.append(
            f"  {r['stat']:<26} {figure(r['a'], 3):>12} {figure(r['b'], 3):>12} "
            f"{figure(r['delta'], 3):>12}"
        )
    return "\n".join(lines) + "\n"
