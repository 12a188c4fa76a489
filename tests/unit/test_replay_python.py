"""Which interpreter a replay uses on a node (pure: from the agent's `hello`)."""

from __future__ import annotations

from areal_console.core.replay.python import CHECK_KIND, choose_python
from areal_console.core.replay.runs import merge_runs

HELLO = {"python_executable": "/home/u/venv/bin/python", "tools": {"torch": True}}


def test_the_agents_python_is_the_default_where_it_has_torch() -> None:
    choice = choose_python(HELLO)
    assert (choice.path, choice.has_torch) == ("/home/u/venv/bin/python", True)
    assert (
        choice.note
        == "python: /home/u/venv/bin/python (the node agent's interpreter, which has torch)"
    )


def test_without_torch_there_python3_is_tried_and_checked() -> None:
    choice = choose_python({"python_executable": "/usr/bin/python3", "tools": {"torch": False}})
    assert (choice.path, choice.has_torch) == ("python3", None)
    assert choice.why == "from the node's PATH: the node agent's interpreter has no torch"
    assert choose_python({}).why == "from the node's PATH: the agent did not say"


def test_a_named_python_is_used_and_checked_unless_it_is_the_agents() -> None:
    assert choose_python(HELLO, "/opt/py/bin/python3").has_torch is None
    assert choose_python(HELLO, "/home/u/venv/bin/python").has_torch is True


def test_torch_checks_are_not_listed_as_jobs() -> None:
    answer = [{"job": "check-1", "state": "finished", "meta": {"kind": CHECK_KIND}},
              {"job": "replay-1", "state": "running", "meta": {"kind": "replay", "plan": {}}}]  # fmt: skip
    assert [r.job_id for r in merge_runs([], {"n1": answer})] == ["replay-1"]
