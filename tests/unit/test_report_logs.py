"""The report's logs from several nodes: a directory per node kept apart, a shared one
(the same file seen from each node, grown between the reads) once, grouped by node in
`### Full logs` and in the bundle."""

from __future__ import annotations

from pathlib import Path

from areal_console.core.metrics.follow import LocalFiles
from areal_console.core.report.bundle import raw_parts
from areal_console.core.report.collect import (
    NodeLogs,
    Where,
    merge_node_logs,
    read_node_logs,
    read_tail,
)
from areal_console.core.report.model import LogTail, ReportInputs
from areal_console.core.report.sections import LOG_MARKDOWN_CHARS, full_logs


def node_logs(where: Where, path: Path) -> NodeLogs:
    found = read_node_logs(where, str(path))
    assert isinstance(found, NodeLogs), found
    return found


def test_a_directory_per_node_and_a_shared_one(tmp_path: Path) -> None:
    own_a, own_b = tmp_path / "a" / "trial", tmp_path / "b" / "trial"
    for d, lines in ((own_a, "rank 0 ok\n"), (own_b, "rank 1 stuck\n")):
        d.mkdir(parents=True)
        (d / "actor.log").write_text(lines)
        (d / "merged.log").write_text("[actor]   " + lines)
    files = LocalFiles()
    a, b = Where("node-a", files, "u"), Where("node-b", files, "u")
    # Two nodes, two directories: each file stays with its node, role logs before merged.
    tails = merge_node_logs([node_logs(a, own_a), node_logs(b, own_b)])
    assert [(t.node, t.role, t.lines) for t in tails] == [
        ("node-a", "actor", ["rank 0 ok"]), ("node-a", "every role", ["[actor]   rank 0 ok"]),
        ("node-b", "actor", ["rank 1 stuck"]), ("node-b", "every role", ["[actor]   rank 1 stuck"]),
    ]  # fmt: skip
    # One directory both nodes see, a line written between the two reads: once, the newer.
    first = node_logs(a, own_a)
    with open(own_a / "actor.log", "a") as fh:
        fh.write("rank 0 waits\n")
    shared = merge_node_logs([first, node_logs(b, own_a)])
    assert [(t.nodes, t.role, t.lines[-1]) for t in shared] == [
        (("node-a", "node-b"), "actor", "rank 0 waits"),
        (("node-a", "node-b"), "every role", "[actor]   rank 0 ok"),
    ]
    inputs = ReportInputs(log_dir=str(own_a), log_nodes=["node-a", "node-b"], logs=shared)
    md = "\n".join(full_logs(inputs))
    assert f"Log directory: `{own_a}` on 2 nodes (node-a, node-b);" in md
    assert "**Nodes node-a, node-b (one shared directory)**:" in md
    assert f"<summary>actor: {own_a}/actor.log (last 2 lines)</summary>" in md
    assert set(raw_parts(inputs)) == {"logs/node-a+node-b/actor.log",
                                      "logs/node-a+node-b/merged.log"}  # fmt: skip


def test_a_node_without_the_directory_says_why(tmp_path: Path) -> None:
    found = read_node_logs(Where("node-c", LocalFiles(), "u"), str(tmp_path / "nope"))
    assert isinstance(found, str) and "no such file or directory" in found
    # Same path, different files (a directory per node that happened to match): apart.
    (tmp_path / "x.log").write_text("one\n")
    t1 = read_tail(LocalFiles(), str(tmp_path / "x.log"), "n1")
    (tmp_path / "x.log").unlink()
    (tmp_path / "x.log").write_text("two\n")
    t2 = read_tail(LocalFiles(), str(tmp_path / "x.log"), "n2")
    assert len(merge_node_logs([NodeLogs(Where("n1", LocalFiles(), "u"), "", tails=[t1]),
                                NodeLogs(Where("n2", LocalFiles(), "u"), "", tails=[t2])])) == 2  # fmt: skip


def test_many_nodes_logs_keep_the_markdown_within_githubs_bound(tmp_path: Path) -> None:
    line = "x" * 190
    tails = [
        LogTail(f"gpu-{n:02d}", "/logs/actor.log", [line] * 200, "", 0, f"1:{n}") for n in range(64)
    ]
    inputs = ReportInputs(log_dir="/logs", log_nodes=[t.node for t in tails], logs=tails)
    md = "\n".join(full_logs(inputs))
    assert LOG_MARKDOWN_CHARS < len(md) < LOG_MARKDOWN_CHARS + 64 * 200
    shown = md.count("<summary>actor: /logs/actor.log (last 40 lines)</summary>")
    named = md.count("- actor: /logs/actor.log (its tail is in the bundle")
    assert shown >= 1 and shown + named == 64 and md.count("**Node gpu-") == 64
