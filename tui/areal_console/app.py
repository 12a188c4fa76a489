"""The Textual application shell, shared by the CLI, the tests and the screenshot script.

Screens are Textual modes, reached with number keys (k9s/nvitop style), `:` commands
(`:nodes`, `:stacks`, `:batches`, `:jobs`) or the command palette (ctrl+p).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol

from textual import on
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from areal_console.core.common.errors import UserError
from areal_console.core.common.identity import UserScope
from areal_console.core.common.settings import Settings
from areal_console.core.common.textfmt import plural
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.monitor import FleetMonitor, NodeView
from areal_console.core.connection.sampling import GoneRank, IdleRank, MemoryTrend
from areal_console.core.metrics.health import thresholds_from
from areal_console.core.metrics.locate import HealthTarget, job_log
from areal_console.core.replay.plan import load_templates
from areal_console.core.rollout.trainer_watch import TrainerStates
from areal_console.core.stacks.capture import (
    CaptureOptions,
    CaptureState,
    capture_and_analyse,
    scope_processes,
)
from areal_console.core.stacks.diagnose import Diagnosis
from areal_console.core.stacks.merge import StackAnalysis
from areal_console.core.stacks.report import AnalysedCapture
from areal_console.core.stacks.scope import JobChoiceError
from areal_console.core.stacks.store import SavedCapture, list_captures, load_capture
from areal_console.core.targets.options import TargetOptions
from areal_console.core.targets.resolve import NodeSpec
from areal_console.dialogs.command_line import CommandLine
from areal_console.dialogs.help import HelpScreen
from areal_console.dialogs.job_choice import JobChoiceDialog
from areal_console.dialogs.replay import ReplayDialog
from areal_console.messages import SavedCapturesListed
from areal_console.navigation import SCREENS
from areal_console.palette import ConsoleCommands
from areal_console.screens.batches import BatchesScreen
from areal_console.screens.cluster import ClusterScreen
from areal_console.screens.health import HealthScreen
from areal_console.screens.runs import RunsScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.styles import STYLESHEET
from areal_console.toast import toast
from areal_console.widgets.vim_table import VimTable
from areal_console.workers import Ticket, WorkerHost, background, cancelled


class Monitor(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def snapshot(self) -> list[NodeView]: ...
    def set_include_all(self, include_all: bool) -> None: ...
    def trust_host_key(self, name: str) -> None: ...
    def trainer_state(self) -> TrainerStates | None: ...
    def memory(self, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], MemoryTrend]: ...
    def recent_gone(self) -> list[GoneRank]: ...
    def idle_gpus(self) -> list[IdleRank]: ...


# Seconds between capture progress updates on the Stacks screen.
PROGRESS_EVERY = 0.1


class ConsoleApp(WorkerHost, App[None]):
    """areal-console: live GPUs and ranks of a training job, one key from a diagnosis."""

    TITLE = "areal-console"
    CSS_PATH = STYLESHEET
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit", tooltip="Leave the console"),
        # Ctrl-C leaves at once from anywhere (an input box too), as in a shell: exit 130.
        Binding("ctrl+c", "interrupt", "Quit", id="app.interrupt", show=False, priority=True,
                tooltip="Leave the console at once (exit status 130)"),
        Binding("question_mark", "help", "Help", id="app.help",
                tooltip="Show every key of this screen"),
        Binding("colon", "command_line", "Command", id="app.command", show=False,
                tooltip="Type a command: :nodes :stacks :batches [PATH] :jobs :health [PATH] :slurm [LOGIN] :theme NAME :q"),
        Binding("1", "goto('nodes')", "Cluster", id="app.goto.nodes", show=False,
                tooltip="The Cluster screen: nodes, GPUs, ranks"),
        Binding("2", "goto('stacks')", "Stacks", id="app.goto.stacks", show=False,
                tooltip="The Stacks screen: the last capture and its diagnosis"),
        Binding("3", "goto('batches')", "Batches", id="app.goto.batches", show=False,
                tooltip="The Batches screen: dumped rollout batches"),
        Binding("4", "goto('jobs')", "Runs", id="app.goto.jobs", show=False,
                tooltip="The Runs screen: replay runs and their logs"),
        Binding("5", "goto('health')", "Health", id="app.goto.health", show=False,
                tooltip="The Health screen: the run's metrics from AReaL's log, checks, stalls"),
        Binding("ctrl+t", "toggle_theme", "Theme", id="app.theme", show=False,
                tooltip="Switch between the dark and light theme"),
    ]  # fmt: skip

    def __init__(
        self,
        fleet: Fleet | None,
        monitor: Monitor | None = None,
        *,
        settings: Settings | None = None,
        read_only: bool | None = None,
        refresh_interval: float | None = None,
        batches_path: str | None = None,
        batches_node: str | None = None,
        initial_filter: str = "",
        welcome: str | None = None,
        health_target: HealthTarget | None = None,
        targets: TargetOptions | None = None,
    ) -> None:
        super().__init__()
        self.welcome = welcome
        # How nodes are reached (ssh config, timeouts, fan-out limits), for this fleet and
        # any the user switches to (a Slurm job picked in :slurm).
        self.targets = targets or TargetOptions()
        self._stop_pacing_notes: Callable[[], None] = lambda: None  # set on mount
        self.batches_path = batches_path
        self.batches_node = batches_node
        self.settings = settings or Settings()
        self.fleet = fleet
        self.refresh_interval = refresh_interval or self.settings.refresh_interval
        self.read_only = self.settings.read_only if read_only is None else read_only
        if monitor is None:
            if fleet is None:
                raise ValueError("ConsoleApp needs a fleet or a monitor")
            monitor = FleetMonitor(
                fleet,
                interval=self.refresh_interval,
                ping_timeout=self.settings.agent_timeout,
            )
        self.monitor: Monitor = monitor
        # Screens other features register: mode -> factory. Missing ones say so when asked.
        self.screen_factories: dict[str, Callable[[], Screen[Any]]] = {
            "nodes": lambda: ClusterScreen(
                refresh_interval=self.refresh_interval, text_filter=initial_filter
            ),
        }
        # Extra command-palette entries: callables returning (label, help, action) triples.
        self.palette_sources: list[Callable[[], list[tuple[str, str, Callable[[], Any]]]]] = []
        self._stacks_screen: StacksScreen | None = None
        self._installed_modes: set[str] = set()  # modes handed to Textual's add_mode
        self.capture_state = CaptureState()  # shared with the Stacks screen
        # `s` starts the capture here, before the Stacks screen exists to wait for it.
        self._capture_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture")
        self._pending_capture: Future[AnalysedCapture] | None = None
        self._progress_lock = threading.Lock()
        self._dumped: dict[str, tuple[int, int, int]] = {}  # node -> (done, total, failed)
        self._progress_shown_at = 0.0
        self.screen_factories["stacks"] = self._new_stacks_screen
        self.palette_sources.append(self._saved_capture_entries)
        self.saved_captures: list[SavedCapture] = []  # refreshed when the palette opens
        self.users = UserScope()  # whose captures and runs are listed (`u`)
        if batches_path:
            self.screen_factories["batches"] = self._new_batches_screen
        if fleet is not None:
            self.screen_factories["jobs"] = lambda: RunsScreen(
                fleet, read_only=self.read_only, users=self.users
            )
        self.health_target = health_target
        if health_target is not None:
            self.screen_factories["health"] = self._new_health_screen

    # lifecycle ------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.theme = (
            self.settings.theme if self.settings.theme in self.available_themes else "textual-dark"
        )
        if self.settings.keymap:
            self.set_keymap(self.settings.keymap)
            unknown = sorted(set(self.settings.keymap) - known_binding_ids())
            if unknown:
                toast(
                    self,
                    f"settings: keymap names no key {', '.join(map(repr, unknown))}; the ids "
                    "are listed with ? on each screen (e.g. cluster.capture)",
                    severity="warning",
                    timeout=15,
                )
        if self.read_only:
            self.sub_title = "read-only"
        # Nodes waiting for a handshake slot behind a login host (pacing.py): said once.
        from areal_console.core.connection.pacing import PACER

        self._stop_pacing_notes = PACER.listen(
            lambda line: self.call_from_thread(self.notify, line, title="SSH", timeout=10)
        )
        self.monitor.start()
        # Known-hosts warnings (`@cert-authority` lines skipped, unreadable lines) arise in
        # connect threads; the CLI prints them at its end, the console shows each once.
        self.set_interval(1.0, self._show_known_hosts_notes)
        for mode, factory in list(self.screen_factories.items()):
            self.register_screen(mode, factory)
        self.switch_mode("nodes")
        if self.welcome:
            # A hint for the Cluster screen: short, and gone once another screen opens (its
            # keys mean other things there).
            toast(self, self.welcome, timeout=8)
            self.mode_change_signal.subscribe(self, self._welcome_done)

    def on_vim_table_at_edge(self, message: VimTable.AtEdge) -> None:
        """A cursor key that could not move says why (screens with a status line of their
        own say it there; the Cluster and Jobs lines are rewritten on every refresh)."""
        toast(self, message.text, timeout=3)

    def _show_known_hosts_notes(self) -> None:
        ssh = sys.modules.get(
            "areal_console.core.connection.ssh"
        )  # not loaded: no SSH node, no notes
        for note in ssh.take_notes() if ssh is not None else []:
            toast(self, note, title="known_hosts", severity="warning", timeout=15)

    def _welcome_done(self, mode: str) -> None:
        if mode != "nodes":
            self.clear_notifications()
            self.mode_change_signal.unsubscribe(self)

    def on_unmount(self) -> None:
        self._stop_pacing_notes()
        self.monitor.stop()
        self._capture_pool.shutdown(wait=False, cancel_futures=True)
        if self.fleet is not None:
            self.fleet.close()

    def register_screen(self, mode: str, factory: Callable[[], Screen[Any]]) -> None:
        """Make a top-level screen reachable by its number key, `:` command and palette.

        Registering a mode again replaces its screen: the next visit builds a new one. The
        mode must not be the one shown (`reopen_screen` handles that case).
        """
        self.screen_factories[mode] = factory
        if not self.is_running:
            return  # on_mount installs every registered mode
        if mode in self._installed_modes:
            self.remove_mode(mode)
        self.add_mode(mode, factory)
        self._installed_modes.add(mode)

    async def reopen_screen(self, mode: str, factory: Callable[[], Screen[Any]]) -> None:
        """Replace `mode`'s screen with a new one from `factory` and show it."""
        if self.current_mode == mode:
            await self.switch_mode("nodes")  # a mode cannot be removed while it is shown
        self.register_screen(mode, factory)
        await self.switch_mode(mode)

    # stacks ---------------------------------------------------------------------------
    def capture_options(self) -> CaptureOptions:
        return CaptureOptions(
            samples=self.settings.capture_samples,
            interval=self.settings.capture_interval,
            timeout=self.settings.pyspy_timeout,
            match=self.capture_state.match,
            native=self.capture_state.native,
            with_locals=self.capture_state.with_locals,
        )

    def take_capture(self) -> AnalysedCapture:
        """Capture every rank of the job (runs in the Stacks screen's worker thread): the
        capture `s` already started, else a new one from the monitor's latest sample.
        Analysed once, as it is saved."""
        pending, self._pending_capture = self._pending_capture, None
        if pending is not None:
            return pending.result()
        if self.fleet is None:
            raise UserError("no live nodes to capture (this console shows recorded data)")
        options = self.capture_options()
        options.job = self.capture_state.job
        options.ended_roles, options.idle_gpus = self._slow_evidence()
        return capture_and_analyse(
            self.fleet, options, sampled=self._latest_processes(), progress=self._progress
        )

    def _slow_evidence(self) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
        """For the diagnosis: the AReaL job's roles whose Slurm job ended (asked of Slurm
        now), and the ranks whose GPU idled across the monitor's samples."""
        idle = tuple(i.to_json() for i in self.monitor.idle_gpus())
        plan = self.targets.areal_plan
        if plan is None:
            return (), idle
        from areal_console.core.slurm.client import SLURM_COMMAND_TIMEOUT
        from areal_console.core.targets.areal import ended_roles_now

        try:
            timeout = self.targets.slurm_timeout or SLURM_COMMAND_TIMEOUT
            ended = ended_roles_now(plan, self.targets.login, timeout)
        except (OSError, UserError):  # Slurm out of reach now: what the start saw
            ended = plan.ended_roles
        return tuple(e.to_json() for e in ended), idle

    def shown_capture(self) -> tuple[StackAnalysis, Diagnosis] | None:
        """The Stacks screen's capture, analysed (None before one is)."""
        screen = self._stacks_screen
        if screen is None or screen.analysis is None or screen.diagnosis is None:
            return None
        return screen.analysis, screen.diagnosis

    def _new_stacks_screen(self) -> StacksScreen:
        self._stacks_screen = StacksScreen(recapture=self.take_capture, state=self.capture_state)
        return self._stacks_screen

    def _latest_processes(self) -> dict[str, list[dict[str, Any]]]:
        """The monitor's newest process sample of every node that is up (no new scan)."""
        return {
            v.name: v.agent_processes()
            for v in self.monitor.snapshot()
            if v.state == "up" and v.sample is not None
        }

    def _progress(self, node: str, pid: int, ok: bool, done: int, total: int) -> None:
        """One dump finished (an agent's reader thread): tell the Stacks screen."""
        with self._progress_lock:
            self._dumped[node] = (done, total, self._dumped.get(node, (0, 0, 0))[2] + (not ok))
            done_all = sum(d for d, _, _ in self._dumped.values())
            total_all = sum(t for _, t, _ in self._dumped.values())
            failed = sum(f for _, _, f in self._dumped.values())
            # A few updates a second are all anyone reads; one per dump made the UI thread
            # compete with the capture (35 ms of a 16-rank capture here).
            now = time.monotonic()
            if done_all < total_all and now - self._progress_shown_at < PROGRESS_EVERY:
                return
            self._progress_shown_at = now
        screen = self._stacks_screen
        if screen is not None:
            screen.post_message(StacksScreen.CaptureProgress(done_all, total_all, failed))

    def action_capture_stacks(self, match: str | None = None) -> None:
        """`s`: capture the job's ranks now and show the Stacks screen.

        The capture starts at the keypress, from the monitor's latest sample, before the
        screen switch. `match` (a regex on command lines; the Cluster screen passes its
        filter) narrows it; when the nodes still run several jobs, a dialog asks which.
        """
        self.capture_state.match = match
        if self.fleet is None:
            toast(self, "No live nodes to capture: this console shows recorded data.",
                  severity="warning")  # fmt: skip
            return
        options = self.capture_options()
        sampled = self._latest_processes()
        try:
            scope_processes(sampled, options)
        except JobChoiceError as exc:
            self.push_screen(JobChoiceDialog(exc.jobs), partial(self._job_chosen, options))
            return
        self._start_capture(options, sampled)

    def _job_chosen(self, options: CaptureOptions, key: str | None) -> None:
        if key is None:
            toast(self, "Capture cancelled: no job chosen.")
            return
        options.job = key
        self._start_capture(options, self._latest_processes())

    def _start_capture(
        self, options: CaptureOptions, sampled: dict[str, list[dict[str, Any]]]
    ) -> None:
        assert self.fleet is not None
        self.capture_state.job = options.job  # `r` on the Stacks screen recaptures the same job
        with self._progress_lock:
            self._dumped, self._progress_shown_at = {}, 0.0
        self._pending_capture = self._capture_pool.submit(
            capture_and_analyse, self.fleet, options, dict(sampled), self._progress
        )
        existing = self._stacks_screen
        self.switch_mode("stacks")  # a new Stacks screen takes the capture as it mounts
        if existing is not None:
            existing.action_recapture()

    def open_saved_capture(self, capture_id: str) -> None:
        self.push_screen(StacksScreen(recapture=lambda: load_capture(capture_id)))

    @background("saved-captures", doing="listing the saved captures",
                retry="open the palette again")  # fmt: skip
    def refresh_saved_captures(self, ticket: Ticket) -> None:
        """Re-read the saved captures off the UI thread (the palette shows the last list)."""
        # Every one: the palette searches them (the newest first).
        self.post_message(SavedCapturesListed(list_captures(), ticket=ticket))

    @on(SavedCapturesListed)
    def _saved_captures_listed(self, message: SavedCapturesListed) -> None:
        if self.fresh(message):
            self.saved_captures = message.captures

    def _saved_capture_entries(self) -> list[tuple[str, str, Callable[[], Any]]]:
        entries: list[tuple[str, str, Callable[[], Any]]] = []
        for saved in self.saved_captures:  # cached: the palette asks at every keystroke
            if not self.users.shows(saved.user):
                continue
            tags = "".join(f" [{t}]" for t in saved.tags)
            help_text = f"{saved.captured_at} · {plural(saved.ranks, 'rank')} · {saved.pattern}"
            if saved.report:
                help_text += f" · report: {saved.report}"
            entries.append((f"Capture {saved.capture_id}{tags}: {saved.title}", help_text,
                            partial(self.open_saved_capture, saved.capture_id)))  # fmt: skip
        return entries

    def action_toggle_users(self) -> None:
        """Everyone's captures and runs, or the user's own (the default): the palette and
        the Runs screen share the choice."""
        screen = self.screen
        if isinstance(screen, RunsScreen):
            screen.action_toggle_users()  # the same scope: it redraws its rows as well
        else:
            toast(self, f"Runs and captures shown: {self.users.toggle()}")

    # batches and replay -----------------------------------------------------------------
    def _new_batches_screen(self) -> BatchesScreen:
        assert self.batches_path is not None
        return BatchesScreen(
            self.batches_path,
            self.fleet,
            self.batches_node,
            on_replay_requested=self.open_replay_dialog,
        )

    def open_batches(self, path: str, node: str | None = None) -> None:
        """Browse `path` (on `node`, or where the console runs): `:batches PATH`. With a
        dump already open, a path that is not there (a typo) keeps it and says so."""
        if self.batches_path is None:
            self._show_batches(path, node)
            return
        self.run_worker(functools.partial(self._check_batches_path, path, node),
                        group="batches-path", exclusive=True, thread=True,
                        exit_on_error=False)  # fmt: skip

    def _check_batches_path(self, path: str, node: str | None) -> None:
        """In a worker: whether `path` can be shown (the node is asked when it is remote)."""
        from areal_node.batches import BatchError, UnsafePickleError

        from areal_console.core.batches.source import RemoteBatchSource

        error = None
        try:
            if node is None or self.fleet is None:
                if not os.path.exists(path):
                    error = f"{path}: no such file or directory"
            else:
                RemoteBatchSource(self.fleet.session(node)).summary(path)
        except UnsafePickleError:
            pass  # there, and the screen asks whether to trust it
        except (BatchError, KeyError, OSError) as exc:
            error = str(exc) or exc.__class__.__name__
        except Exception as exc:  # the node's failure: shown, the open view kept
            error = f"{node}: {exc}"
        self.call_from_thread(self._batches_checked, path, node, error)

    def _batches_checked(self, path: str, node: str | None, error: str | None) -> None:
        if error is None:
            self._show_batches(path, node)
        else:
            toast(self, f":batches {path}: {error} (the open dump is kept)", severity="error")

    def _show_batches(self, path: str, node: str | None) -> None:
        self.batches_path, self.batches_node = path, node
        self.call_later(self.reopen_screen, "batches", self._new_batches_screen)

    def open_replay_dialog(self, path: str, steps: list[int]) -> None:
        """`r` in the Batches screen: the launch dialog for the node that holds the dump."""
        if self.fleet is None or not len(self.fleet):
            toast(self, "No live node to launch on.", severity="warning")
            return
        node = self.batches_node or self.fleet.sessions[0].name

        def launched(record: Any) -> None:
            if record is not None:
                toast(self, f"Replay {record.job_id} launched on {record.node}")
                self.action_goto("jobs")
                try:
                    jobs_screen = self.get_screen_stack("jobs")[0]
                except (KeyError, IndexError):
                    return
                if isinstance(jobs_screen, RunsScreen):
                    jobs_screen.show_job(record.node, record.job_id)

        try:
            templates = load_templates(self.settings.launch_templates)
        except UserError as exc:
            toast(self, f"settings: {exc}", severity="error")
            return
        if self.settings.replay_template not in templates:
            toast(self, f"settings: no launch template {self.settings.replay_template!r} "
                  f"(have: {', '.join(templates)})", severity="error")  # fmt: skip
            return
        dialog = ReplayDialog(
            self.fleet, path, node, template=self.settings.replay_template,
            templates=templates, read_only=self.read_only, steps=steps,
        )  # fmt: skip
        self.push_screen(dialog, launched)

    # training health --------------------------------------------------------------------
    def _new_health_screen(self) -> HealthScreen:
        assert self.health_target is not None
        try:
            thresholds = thresholds_from(self.settings.health)
        except KeyError as exc:
            toast(self, f"settings: unknown health threshold {exc.args[0]!r}", severity="error")
            thresholds = None
        return HealthScreen(self.health_target, thresholds=thresholds)

    def open_health(self, target: HealthTarget) -> None:
        """Follow `target`'s metrics in the Health screen (`:health PATH`, `h` on Cluster).
        A local path that is not there (a typo) keeps the run already open and says so."""
        missing = target.path and target.node is None and not os.path.exists(target.path)
        if missing and self.health_target is not None:
            toast(self, f":health {target.path}: no such file or directory (the open run is kept)",
                  severity="error")  # fmt: skip
            return
        self.health_target = target
        self.call_later(self.reopen_screen, "health", self._new_health_screen)

    def open_health_for_job(self, match: str | None) -> None:
        """The job's log (`job_log`: the Cluster screen's filter picks the job), else the
        run already open."""
        for view in self.monitor.snapshot():
            try:
                found = job_log(view.processes, view.user, match)
            except UserError:
                found = None
            if found:
                node = None if self.fleet is None else view.name
                self.open_health(HealthTarget(found, node, match))
                return
        if self.health_target is not None:
            self.action_goto("health")
            return
        what = f"matching {match!r} " if match else ""
        toast(self, f"No process {what}names its AReaL log directory (--fileroot, "
              "--experiment-name, --trial-name). Open a log with :health PATH.",
              severity="warning")  # fmt: skip

    # slurm ------------------------------------------------------------------------------
    def open_slurm_view(self, login: str | None = None) -> None:
        """`:slurm [LOGIN]`: your Slurm jobs; enter opens one's nodes in the Cluster screen."""
        from areal_console.core.slurm.client import job_lister, make_runner
        from areal_console.screens.slurm_jobs import SlurmJobsScreen

        def chosen(job_id: str | None) -> None:
            if job_id:
                toast(self, f"Asking Slurm for job {job_id}'s nodes…")
                self._resolve_slurm_job(job_id, login)

        self.push_screen(SlurmJobsScreen(job_lister(make_runner(login))), chosen)

    @background("slurm-open", doing="finding the Slurm job's nodes",
                retry="pick the job again in :slurm")  # fmt: skip
    def _resolve_slurm_job(self, ticket: Ticket, job_id: str, login: str | None) -> None:
        from areal_console.core.slurm.targets import resolve_slurm_targets

        plan = resolve_slurm_targets(job_id, login=login)
        if cancelled():
            return  # another job was picked meanwhile
        for note in plan.notes:
            self.call_from_thread(self.notify, note, severity="warning")
        self.call_from_thread(self.replace_targets, plan.specs)

    def replace_targets(self, specs: list[NodeSpec]) -> None:
        """Watch other nodes (a Slurm job picked in the Slurm view) in place of the current
        ones, reached with the same target options."""
        old_fleet, old_monitor = self.fleet, self.monitor
        self.fleet = Fleet(specs, **self.targets.fleet_options())
        self.monitor = FleetMonitor(
            self.fleet,
            interval=self.refresh_interval,
            ping_timeout=self.settings.agent_timeout,
        )
        self.monitor.start()
        old_monitor.stop()
        if old_fleet is not None:
            self._close_fleet(old_fleet)
        fleet = self.fleet
        self.action_goto("nodes")
        # Screens built on the old nodes are dropped; the next visit builds new ones.
        self.register_screen(
            "jobs", lambda: RunsScreen(fleet, read_only=self.read_only, users=self.users)
        )
        self.register_screen("stacks", self.screen_factories["stacks"])
        self._stacks_screen = None
        toast(self, f"Now watching {len(specs)} node(s)")

    @background("close-fleet", doing="closing the old nodes' sessions", exclusive=False)
    def _close_fleet(self, ticket: Ticket, fleet: Fleet) -> None:
        fleet.close()

    # navigation -----------------------------------------------------------------------
    def action_goto(self, mode: str) -> None:
        entry = next((e for e in SCREENS if e.mode == mode), None)
        if mode not in self.screen_factories:
            if mode == "batches":
                toast(self, "Open a dump first: :batches PATH (a step_*.pt file or its directory)")
            elif mode == "health":
                self.open_health_for_job(self.capture_state.match)
            else:
                title = entry.title if entry else mode
                toast(self, f"The {title} screen needs live nodes.", severity="warning")
            return
        if self.current_mode != mode:
            self.switch_mode(mode)

    def action_command_line(self) -> None:
        self.push_screen(CommandLine(), self.run_command)

    def run_command(self, text: str | None) -> None:
        """Execute one `:` command (without the colon)."""
        if not text:
            return
        word, _, rest = text.strip().lstrip(":").partition(" ")
        word = word.lower()
        if word == "slurm":
            self.open_slurm_view(rest.strip() or None)
            return
        if word in ("batches", "batch", "b") and rest.strip():
            self.open_batches(rest.strip(), self.batches_node)
            return
        if word in ("health", "metrics") and rest.strip():
            self.open_health(HealthTarget(rest.strip()))
            return
        for entry in SCREENS:
            if word in (entry.mode, *entry.aliases):
                self.action_goto(entry.mode)
                return
        if word in ("q", "quit", "exit"):
            self.exit()
        elif word in ("help", "h"):
            self.action_help()
        elif word == "theme":
            name = rest.strip()
            if name in self.available_themes:
                self.theme = name
            else:
                toast(self, f"No theme {name!r}. Themes: {', '.join(sorted(self.available_themes))}",
                      severity="error")  # fmt: skip
        else:
            known = ", ".join(f":{e.mode}" for e in SCREENS)
            toast(self, f"Unknown command {word!r}. Try {known}, :theme NAME, :q", severity="error")

    def action_interrupt(self) -> None:
        self.exit(return_code=130)

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        own: list[tuple[str, str, str, str]] = []
        generic: list[tuple[str, str, str, str]] = []
        for key, active in self.active_bindings.items():
            binding = active.binding
            if not binding.description:
                continue
            # The console's own keys (they carry ids) first, widget navigation after.
            (own if binding.id else generic).append(
                (key, binding.description, binding.tooltip or "", binding.id or "")
            )
        title = f"Keys — {self.screen.__class__.__name__.removesuffix('Screen')}"
        if self.read_only:
            title += " (read-only mode: stop and launch are disabled)"
        nav = [(e.key, e.title, f"Go to the {e.title} screen (or :{e.mode})", "")
               for e in SCREENS]  # fmt: skip
        seen = {k for k, _, _, _ in own}
        self.push_screen(HelpScreen(title, own + [n for n in nav if n[0] not in seen] + generic))


def known_binding_ids() -> set[str]:
    """Every binding id of the console (what a keymap in the settings may name)."""
    import importlib
    import pkgutil

    import areal_console.screens
    import areal_console.widgets

    classes: list[type] = [ConsoleApp]
    for package in (areal_console.screens, areal_console.widgets):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            classes += [v for v in vars(module).values() if isinstance(v, type)]
    ids: set[str] = set()
    for cls in classes:
        for binding in getattr(cls, "BINDINGS", []) or []:
            if isinstance(binding, Binding) and binding.id:
                ids.add(binding.id)
    return ids


def create_app(specs: list[NodeSpec], **options: Any) -> ConsoleApp:
    """The app on live nodes (the CLI's path); `targets` (a `TargetOptions`) says how
    they are reached."""
    targets = options.get("targets") or TargetOptions()
    return ConsoleApp(Fleet(specs, **targets.fleet_options()), **options)
