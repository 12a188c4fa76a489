"""Bundle members never collide: two logs whose names make one safe member name (or one
masked name) each keep a member of their own, named the same way every time."""

from __future__ import annotations

import tarfile
from pathlib import Path

from areal_console.core.report.bundle import build_report, unique_member, write_report
from areal_console.core.report.model import LogTail, ReportInputs
from areal_console.core.report.redact import Redactor


def test_logs_whose_safe_names_meet_keep_a_member_each(tmp_path: Path) -> None:
    logs = [
        LogTail("n1", "/logs/_main.log", ["first"], "first\n", 6),
        LogTail("n1", "/logs/main.log", ["second"], "second\n", 7),
        LogTail("n1", "/other/main.log", ["third"], "third\n", 6),
    ]
    report = build_report(ReportInputs(job="e/t", made_at="now", logs=logs), Redactor())
    bundle, _ = write_report(report, str(tmp_path / "r.md"))
    with tarfile.open(bundle) as tar:
        members = {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.name.startswith("report/logs/")
        }
    assert members == {
        "report/logs/n1/main.log": b"first\n",
        "report/logs/n1/main~2.log": b"second\n",
        "report/logs/n1/main~3.log": b"third\n",
    }
    again = build_report(ReportInputs(job="e/t", made_at="now", logs=logs), Redactor())
    assert [f.name for f in again.files] == [f.name for f in report.files]  # deterministic


def test_a_suffixed_name_keeps_within_the_component_bound() -> None:
    long = "logs/n1/" + "a" * 92 + ".log"
    taken = {long}
    name = unique_member(long, taken)
    assert name.endswith("~2.log") and len(name.rsplit("/", 1)[1]) <= 96
    assert unique_member("logs/n1/README", {"logs/n1/README"}) == "logs/n1/README~2"
