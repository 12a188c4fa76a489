"""The batch reader's agent ops: the agent's `load` adds `OPS` to its request handlers; a
file that cannot be read is an `OpError` reply with the reader's one-line reason."""

from __future__ import annotations

import os
from typing import Any

from areal_node.agent.protocol import OpError
from areal_node.batches.loader import BatchError
from areal_node.batches.summary import list_dump_dir, summarize
from areal_node.batches.views import json_safe, resolve_step_file, sample_table, sample_view


def _common_args(args: dict[str, Any]) -> dict[str, Any]:
    eos = args.get("eos_token_id")
    return {"eos_token_id": eos, "trust_pickle": bool(args.get("trust_pickle", False))}


def _op_summary(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return json_safe(summarize(str(args["path"]), **_common_args(args)))
    except BatchError as exc:
        raise OpError(str(exc)) from None


def _op_sample(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        path = resolve_step_file(str(args["path"]), args.get("step"), args.get("dp_rank"))
        return json_safe(sample_view(path, int(args["index"]), **_common_args(args)))
    except BatchError as exc:
        raise OpError(str(exc)) from None


def _op_samples(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        path = resolve_step_file(str(args["path"]), args.get("step"), args.get("dp_rank"))
        return json_safe(
            sample_table(
                path,
                **_common_args(args),
                offset=int(args.get("offset", 0)),
                limit=args.get("limit"),
            )
        )
    except BatchError as exc:
        raise OpError(str(exc)) from None


def _op_list(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    path = str(args["path"])
    try:
        if not os.path.isdir(path):
            raise BatchError(f"{path}: not a directory")
        return {
            "path": path,
            "files": [{k: v for k, v in e.items() if k != "path"} for e in list_dump_dir(path)],
        }
    except (BatchError, OSError) as exc:
        raise OpError(str(exc)) from None


OPS = {
    "batch_summary": _op_summary,
    "batch_sample": _op_sample,
    "batch_samples": _op_samples,
    "batch_list": _op_list,
}
