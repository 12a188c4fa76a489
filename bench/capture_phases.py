"""One `areal-console stacks --local --json ARGS...` run, timed phase by phase.

    python -m bench.capture_phases ARGS...   (run by `bench.bench_capture --profile`)

The run is the real command (`areal_console.cli.run`, the same exit), with timers wrapped
around the functions each phase calls; nothing else changes. When `main` returns, one line
of JSON goes to stderr: `started` (this process's first statement, on the system's
monotonic clock, so the parent can tell the interpreter's start from the rest), `ended`
(when `main` returned), the modules imported up front and during `main`, the exclusive
seconds of each phase (a phase's time excludes the phases timed inside it), and each
py-spy dump's own seconds as the agent measured them.
"""

import time

STARTED = time.monotonic()

import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402


class Phases:
    """Exclusive time per phase: a timer nested in another is subtracted from it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []  # time spent in nested timers, per open timer

    def wrap(self, name: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            label = name if isinstance(name, str) else name(*args, **kwargs)
            self._inner.append(0.0)
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.monotonic() - t0
                inner = self._inner.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + total - inner
                if self._inner:
                    self._inner[-1] += total

        return timed


# What each agent op is, in the breakdown.
OPS = {
    "sample": "process discovery (sample)",
    "pyspy": "py-spy dumps",
    "fr_traces": "Flight Recorder read",
    "file_tail": "rollout files",
}


def main() -> None:
    phases = Phases()
    before = len(sys.modules)
    t0 = time.monotonic()
    import areal_console.commands.stacks as command
    import areal_console.core.stacks.capture as capture
    import areal_console.core.stacks.report as report
    from areal_console import cli
    from areal_console.core.connection import fleet, transport
    from areal_node.agent import serve  # noqa: F401  (what the in-process agent runs)

    cli.build_parser("stacks")
    phases.seconds["imports"] = time.monotonic() - t0
    imported_up_front = len(sys.modules) - before

    dump_seconds: list[float] = []
    call = fleet.NodeSession.call

    def agent_call(session: Any, op: str, *args: Any, **kwargs: Any) -> Any:
        reply = call(session, op, *args, **kwargs)
        if op == "pyspy":
            dump_seconds.extend(d.get("seconds", 0.0) for d in reply.get("dumps", []))
        return reply

    fleet.NodeSession.call = phases.wrap(
        lambda s, op, *a, **k: OPS.get(op, f"agent op {op}"), agent_call
    )
    transport.InProcessChannel.__init__ = phases.wrap(
        "agent start", transport.InProcessChannel.__init__
    )
    fleet.AgentClient.start = phases.wrap("agent hello", fleet.AgentClient.start)
    capture.build_capture = phases.wrap("build capture", capture.build_capture)
    capture.analysed = phases.wrap("merge + diagnose", capture.analysed)
    report.AnalysedCapture.json = phases.wrap("JSON document", report.AnalysedCapture.json)
    capture.save_capture = phases.wrap("save capture", capture.save_capture)
    encoder = json.dumps

    class JsonOut:
        dumps = staticmethod(phases.wrap("JSON encode (output)", encoder))
        dump = staticmethod(json.dump)

    command.json = JsonOut

    inner = cli.main

    def timed_main(argv: Any = None) -> int:
        t1 = time.monotonic()
        before_main = len(sys.modules)
        code = phases.wrap("rest of main", inner)(argv)
        ended = time.monotonic()
        phases.seconds["main"] = ended - t1
        record = {
            "started": STARTED,
            "ended": ended,
            "imported_up_front": imported_up_front,
            "imported_in_main": len(sys.modules) - before_main,
            "phases": phases.seconds,
            "dumps": dump_seconds,
        }
        print(json.dumps(record), file=sys.stderr)
        return code

    cli.main = timed_main
    cli.run()


if __name__ == "__main__":
    main()
