"""Command-line entry point: `areal-console [COMMAND] ...`.

Each subcommand lives in its own module under `areal_console.commands` and exposes
`register(subparsers)`, which adds its parser and sets `handler` to a function taking the
parsed arguments and returning an exit code.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import warnings
from collections.abc import Sequence

from areal_console import __version__
from areal_console.core.common.errors import (
    EXIT_ERROR,
    EXIT_PARTIAL,
    EXIT_USAGE,
    ChoiceError,
    UsageError,
    UserError,
)
from areal_console.core.common.textfmt import PrintableStream, printable

# Commands whose whole output is text for a terminal (not the TUI, not a training run's
# own log): it is written through `PrintableStream`, so no remote string reaches the
# terminal with its control characters.
PRINTABLE_COMMANDS = {"nodes", "stacks", "batch", "replay", "slurm", "metrics", "report", "watch"}

# Subcommand modules, in the order `--help` lists them; each registers the command named
# like its module (`areal_console.commands.stacks` -> `stacks`).
COMMAND_MODULES = [
    "areal_console.commands.tui",
    "areal_console.commands.demo",
    "areal_console.commands.nodes",
    "areal_console.commands.stacks",
    "areal_console.commands.batch",
    "areal_console.commands.trainer",
    "areal_console.commands.replay",
    "areal_console.commands.slurm",
    "areal_console.commands.metrics",
    "areal_console.commands.report",
    "areal_console.commands.watch",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command`, only that subcommand's module is imported (a
    command's start must not pay for importing every other command)."""
    parser = _Parser(
        prog="areal-console",
        description="Debug distributed RL training jobs: live GPUs and ranks, stacks, batches.",
    )
    parser.add_argument("--version", action="version", version=f"areal-console {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules = [m for m in COMMAND_MODULES if m.rsplit(".", 1)[1] == command] or COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # numpy is a dependency, but an install without it (--no-deps, a stripped image) must
    # not print torch's "Failed to initialize NumPy" warning on every command that loads torch.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--version"]:  # no command's module is needed to say it
        print(f"areal-console {__version__}")
        return 0
    try:
        # No subcommand (or only target options) opens the TUI.
        if not args_list or (
            args_list[0].startswith("-")
            and args_list[0]
            not in (
                "-h",
                "--help",
                "--version",
            )
        ):
            args_list = ["tui", *args_list]
        _check_command(args_list[0])
        parser = build_parser(args_list[0] if args_list else None)
        args, extra = parser.parse_known_args(args_list)
        if isinstance(getattr(args, "overrides", None), list):
            # argparse takes `key=value` words only before the first option: later ones
            # (`replay DIR --wait actor.eps_clip=0.1`) are overrides too, in their order.
            args.overrides += [w for w in extra if not w.startswith("-")]
            extra = [w for w in extra if w.startswith("-")]
        if extra:
            raise UsageError(_unrecognized(parser, args.command, extra))
        if not getattr(args, "handler", None):
            parser.print_help()
            return EXIT_USAGE
        if args.command in PRINTABLE_COMMANDS:
            from areal_console.core.connection.pacing import PACER

            # Nodes waiting for a handshake slot behind a login host: said once, on stderr.
            stop = PACER.listen(lambda line: print(f"note: {printable(line)}", file=sys.stderr))
            try:
                return _partial_when_stale(args, _run_printable(args))
            finally:
                stop()
        return int(args.handler(args))
    except UsageError as exc:
        print(f"error: {printable(exc)}", file=sys.stderr)
        for line in exc.choices if isinstance(exc, ChoiceError) else ():
            print(printable(line), file=sys.stderr)
        return EXIT_USAGE
    except UserError as exc:
        print(f"error: {printable(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_ERROR


def command_names() -> list[str]:
    """The subcommands, in `--help` order (each is named like its module)."""
    return [m.rsplit(".", 1)[1] for m in COMMAND_MODULES]


def _check_command(word: str) -> None:
    """A word that is no command is a usage error naming the closest command."""
    names = command_names()
    if word.startswith("-") or word in names:
        return
    import difflib  # only for a word that is no command: every start would pay for it

    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (commands: {', '.join(names)})"
    raise UsageError(f"unknown command {word!r}{hint}")


def _unrecognized(parser: argparse.ArgumentParser, command: str | None, extra: list[str]) -> str:
    """The error for arguments no option takes, named by the command's own parser (argparse
    names the top-level one), with the command's closest option: "areal-console stacks:
    unrecognized arguments: --samles (did you mean '--samples'?)"."""
    import difflib  # only for a bad argument: every start would pay for it

    options = list(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            options += list(action.choices[command]._option_string_actions)
    word = extra[0].partition("=")[0]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.8) if word[:1] == "-" else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    prog = f"areal-console {command}" if command else "areal-console"
    return f"{prog}: unrecognized arguments: {' '.join(extra)}{hint}"


def _partial_when_stale(args: argparse.Namespace, code: int) -> int:
    """A headless command that succeeded on a job with stale records or a role whose Slurm
    job ended (`--areal`) is partial (3): the warning lines already said which."""
    options = getattr(args, "_target_options", None)  # see commands/options.py
    plan = getattr(options, "areal_plan", None)
    if code == 0 and plan is not None and (plan.stale or plan.refused or plan.ended_roles):
        return EXIT_PARTIAL
    return code


def run() -> None:
    """The `areal-console` program: `main`, then an exit that skips the module teardown.

    Tearing down the ~190 modules a command loaded costs more than a one-shot command's
    own output (about a tenth of a local capture); nothing in it matters once the exit
    handlers have run and the output is flushed. Where a non-daemon thread still runs, the
    interpreter's own exit (which waits for it) is kept.
    """
    code = main()
    if _threads_left():
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the reader is gone, nothing to say
            code = code or EXIT_ERROR
    os._exit(code)


def _threads_left() -> bool:
    threading = sys.modules.get("threading")
    if threading is None:
        return False
    main_thread = threading.main_thread()
    return any(
        t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()
    )


def _run_printable(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(out), PrintableStream(err)
    try:
        return int(args.handler(args))
    finally:
        ssh = sys.modules.get("areal_console.core.connection.ssh")
        for note in ssh.take_notes() if ssh is not None else []:
            print(f"warning: {note}", file=sys.stderr)  # e.g. skipped known_hosts lines
        sys.stdout, sys.stderr = out, err
