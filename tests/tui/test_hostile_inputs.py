"""The threat model in one place: hostile or unlucky inputs, and what the console does.

Each test below reproduces one way an input broke the console, and checks the fix: a clear
one-line error (no traceback), the exit code of the contract (0 ok, 1 runtime error,
2 usage or bad value, 3 partial), and the rest of the work carrying on. The threats:

1. terminal escapes in remote text (process command lines, frame and file names);
2. the node's agent cache (planted symlinks, foreign or shared directories, FIFOs);
3. YAML alias bombs and huge values in the inventory and settings files;
4. `@cert-authority` / `@revoked` lines in known_hosts;
5. every command that reaches nodes honours the same target options;
6. the Slurm hostlist grammar (checked against the real `scontrol show hostnames`);
7. unreadable `.pt` files in a dump directory;
8. a malformed saved capture among good ones;
9. a node whose python3 is too old for the agent;
10. the CLI contract (exit codes, warnings, bad values, torch noise, random bytes);
11. launch templates: fields substituted in the template only, never inside values;
12. bounded waits (an SSH banner without a newline, the agent start);
13. a frozen (SIGSTOPped) agent, told apart from a dropped connection;
14. through Slurm, the node's interpreter resolved on the node.

Cases that need the sshd test cluster or the Slurm cluster live in test_ssh.py,
test_fleet_cluster.py and test_slurm.py; they are listed by name at the end of this file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, wait_for

from tests.support.interpreters import find_python
from tests.support.waits import until

ESC = "\x1b"
HOSTILE_ARG = "\x1b]0;pwned\x07\x1b[2J\x9b31m[red]markup[/bold]"


# --------------------------------------------------------------------------------------
# 1. terminal escapes in remote text

HOSTILE_RANK = r"""
import sys, time
def hang():
    time.sleep(600)
name = "hang\x1b]0;pwned\x07\x1b[2J"
code = hang.__code__.replace(co_name=name)
if hasattr(code, "co_qualname"):
    code = code.replace(co_qualname=name)
hang.__code__ = code
exec(compile("print('ready', flush=True)\nhang()", "/tmp/evil\x1b[31m.py", "exec"))
"""


@pytest.fixture(scope="module")
def hostile_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[str]]:
    """A real process posing as rank 0, with escape sequences in its argv, its function
    name and its file name."""
    where = tmp_path_factory.mktemp("hostile")
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    proc = subprocess.Popen(
        [sys.executable, "-", HOSTILE_ARG, where.name],  # the script on stdin: a short argv
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(HOSTILE_RANK)
    proc.stdin.close()
    assert proc.stdout.readline().strip() == "ready"
    proc.marker = where.name  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_nodes_text_escapes_control_characters(hostile_rank: subprocess.Popen[str]) -> None:
    for extra in ([], ["--all"]):
        result = run_cli("nodes", "--local", *extra)
        assert result.returncode == 0, result.stderr
        assert (
            ESC not in result.stdout and "\x9b" not in result.stdout and "\x07" not in result.stdout
        )
        line = next(ln for ln in result.stdout.splitlines() if str(hostile_rank.pid) in ln)
        assert "\\x1b]0;pwned\\x07" in line  # the escape shown as text, not sent


def test_stacks_text_escapes_frame_and_file_names(hostile_rank: subprocess.Popen[str]) -> None:
    result = run_cli("stacks", "--local", "--match", hostile_rank.marker)  # type: ignore[attr-defined]
    assert result.returncode == 0, result.stderr
    assert ESC not in result.stdout and "\x07" not in result.stdout
    assert "hang\\x1b]0;pwned\\x07\\x1b[2J" in result.stdout
    assert "/tmp/evil\\x1b[31m.py" in result.stdout


async def test_cluster_and_stacks_screens_escape_remote_text(
    hostile_rank: subprocess.Popen[str],
) -> None:
    from areal_console.app import ConsoleApp
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.stacks.capture import CaptureOptions, take_capture
    from areal_console.core.targets.resolve import local_node
    from areal_console.screens.stacks import StacksScreen
    from areal_console.widgets.process_table import ProcessTable

    fleet = Fleet([local_node()])
    app = ConsoleApp(fleet, refresh_interval=0.2)
    key = f"{local_node().name}:{hostile_rank.pid}"
    async with app.run_test(size=(200, 40)) as pilot:
        table = app.screen.query_one(ProcessTable)
        await until(pilot, lambda: key in table.rows, what="the hostile rank's row")
        # Drawn (escaped or not, "pwned" shows once the row's cells are on the screen).
        await until(pilot, lambda: "pwned" in app.export_screenshot(), what="the row drawn")
        svg = app.export_screenshot()
        assert ESC not in svg and "\x9b" not in svg
        assert "\\x1b]0;pwned\\x07" in svg.replace("&#x27;", "'")
        assert "[red]markup[/bold]" in svg  # shown as text, not read as markup

        capture = take_capture(
            fleet,
            CaptureOptions(match=hostile_rank.marker),  # type: ignore[attr-defined]
            save=False,
        )
        screen = StacksScreen(capture)
        await app.push_screen(screen)
        await until(pilot, lambda: screen.analysis is not None, what="the analysis")
        await until(pilot, lambda: "pwned" in app.export_screenshot(), what="the stacks drawn")
        svg = app.export_screenshot()
        assert ESC not in svg and "\x07" not in svg
        assert "hang\\x1b]0;pwned" in svg


# --------------------------------------------------------------------------------------
# 2. the agent cache on the node (the bootstrap that runs there)


def _bootstrap(home: Path, python: str = sys.executable) -> Any:
    """The real bootstrap in a child process, with HOME (and its cache) at `home`."""
    from areal_console.core.connection.transport import ProcessChannel, bootstrap_argv

    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    env.pop("PYTHONPATH", None)
    return ProcessChannel(bootstrap_argv(python), "agent", env=env, python=python, node="n07")


def _start(channel: Any, timeout: float = 10) -> Any:
    from areal_console.core.connection.client import AgentClient

    client = AgentClient(channel)
    try:
        return client.start(timeout=timeout)
    finally:
        client.close()


def _cache_file(home: Path) -> Path:
    from areal_console.core.connection.payload import node_payload

    return home / ".cache" / "areal-console" / node_payload().name


def test_cache_write_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    from areal_console.core.connection.client import AgentClient
    from areal_console.core.connection.transport import source_frame

    victim = tmp_path / "victim"
    victim.write_text("precious")
    channel = _bootstrap(tmp_path)
    try:
        assert b"need_source" in channel.recv_line()  # the bootstrap now waits for the payload
        temp = Path(f"{_cache_file(tmp_path)}.{channel.proc.pid}.tmp")
        temp.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temp.symlink_to(victim)  # planted at the temp name it is about to write
        channel.send(source_frame())
        client = AgentClient(channel)
        client._ready.wait(10)
        assert client.request("ping", timeout=10) is not None  # it still runs, uncached
    finally:
        channel.close()
    assert victim.read_text() == "precious"
    assert (tmp_path / ".cache" / "areal-console").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_cache_path_that_is_not_a_file_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    from areal_console.core.connection.client import AgentDisconnected

    path = _cache_file(tmp_path)
    path.parent.mkdir(parents=True, mode=0o700)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    t0 = time.monotonic()
    with pytest.raises(AgentDisconnected, match="is not a regular file"):
        _start(_bootstrap(tmp_path))
    assert time.monotonic() - t0 < 5  # an error, not a hang


@pytest.mark.parametrize("problem", ["world-writable", "foreign", "link"])
def test_unsafe_cache_directory_is_refused(tmp_path: Path, problem: str) -> None:
    from areal_console.core.connection.client import AgentDisconnected

    cache = tmp_path / ".cache" / "areal-console"
    cache.parent.mkdir()
    if problem == "link":
        (tmp_path / "shared").mkdir(mode=0o700)
        cache.symlink_to(tmp_path / "shared")
        why = "is not a directory"
    else:
        cache.mkdir(mode=0o700)
        if problem == "world-writable":
            cache.chmod(0o777)
            why = "writable by others"
        else:
            if os.geteuid() != 0:
                pytest.skip("giving a directory to another user needs root")
            os.chown(cache, 4242, 4242)
            why = "belongs to uid 4242"
    with pytest.raises(AgentDisconnected, match=why):
        _start(_bootstrap(tmp_path))
    # Nothing was written into the refused directory (for "link": the link's target).
    assert cache.is_dir() and list(cache.iterdir()) == []


# --------------------------------------------------------------------------------------
# 9. a node whose python3 is too old: real interpreters (.ci/run installs 3.8 and 3.9;
# the bootstrap's needs of 3.6 and 3.7 are checked by vermin in test_node_python.py)


def _old_python(version: str) -> str:
    found = find_python(version)
    if found is None:
        pytest.skip(f"no Python {version} on this machine (.ci/run installs it with uv)")
    return found


@pytest.mark.parametrize("version", ["3.8"])
def test_too_old_python_is_named_with_the_minimum(tmp_path: Path, version: str) -> None:
    from areal_console.core.connection.client import AgentDisconnected

    python = _old_python(version)
    with pytest.raises(AgentDisconnected) as err:
        _start(_bootstrap(tmp_path, python))
    message = str(err.value)
    assert message.startswith(f"{python} on n07 is {version}.")
    assert "the agent needs >= 3.9" in message and "Traceback" not in message


def test_the_minimum_python_really_runs_the_agent(tmp_path: Path) -> None:
    """MIN_PYTHON is what the agent needs: the oldest accepted version answers `sample`."""
    from areal_console.core.connection.client import AgentClient
    from areal_console.core.connection.transport import MIN_PYTHON

    python = _old_python(".".join(map(str, MIN_PYTHON)))
    client = AgentClient(_bootstrap(tmp_path, python))
    try:
        hello = client.start(timeout=20)
        assert hello["python"].startswith(".".join(map(str, MIN_PYTHON)))
        assert "processes" in client.request("sample", {"all": True}, timeout=20)
    finally:
        client.close()


# --------------------------------------------------------------------------------------
# 14. the interpreter is chosen on the node (the Slurm form; real Slurm in test_slurm.py)

FAKE_OLD_PYTHON = (
    "#!/bin/sh\n# answers the version probe as Python 3.6 would: too old\nprintf 3.6.15\nexit 1\n"
)


def test_no_usable_python_on_the_node_names_every_candidate(tmp_path: Path) -> None:
    """No Python >= the minimum anywhere: every candidate is named with its version. The old
    interpreters here are a stand-in script (answering the version probe as 3.6 does),
    bound over /usr/bin/python3 in a private mount namespace."""
    from areal_console.core.connection.client import AgentDisconnected
    from areal_console.core.connection.transport import BOOTSTRAP, ProcessChannel, resolving_argv

    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a mount namespace here")
    fake = tmp_path / "python3"
    fake.write_text(FAKE_OLD_PYTHON)
    fake.chmod(0o755)
    hide = f"mount --bind {fake} /usr/bin/python3"
    if Path("/usr/local/bin/python3").exists():
        hide += f" && mount --bind {fake} /usr/local/bin/python3"
    argv = ["unshare", "--mount", "/bin/sh", "-c", f'{hide} && exec "$@"', "sh"]
    argv += resolving_argv("python3", BOOTSTRAP)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
    channel = ProcessChannel(argv, "srun", env=env, python="python3", node="n07")
    with pytest.raises(AgentDisconnected) as err:
        _start(channel)
    message = str(err.value)
    assert message.startswith("no Python >= 3.9 on n07 (tried ")
    assert f"{fake} is 3.6.15" in message and "/usr/bin/python3 is 3.6.15" in message


# --------------------------------------------------------------------------------------
# 13. a frozen agent is not a dropped connection


def test_frozen_agent_is_unresponsive_and_keeps_its_link() -> None:
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.connection.monitor import FleetMonitor
    from areal_console.core.targets.resolve import local_node

    fleet = Fleet([local_node()])
    monitor = FleetMonitor(fleet, interval=0.2, ping_every=0.2, ping_timeout=1.0)
    name = fleet.sessions[0].name
    monitor.start()
    try:
        wait_for(lambda: monitor.snapshot()[0].state == "up", 30, what="the node up")
        client = fleet.sessions[0].client
        assert client is not None
        pid = fleet.sessions[0].hello["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            view = wait_for(
                lambda: next((v for v in monitor.snapshot() if v.state != "up"), None),
                30,
                what="the frozen agent noticed",
            )
            assert view.name == name and view.state == "unresponsive", view
            assert view.error.startswith("agent not responding for ")
            # The wait is the check: for several ping rounds it stays unresponsive (not
            # down, not reconnected); no condition can show that nothing changes.
            time.sleep(1.5)
            assert monitor.snapshot()[0].state == "unresponsive"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: monitor.snapshot()[0].state == "up", 30, what="the agent back")
        assert fleet.sessions[0].client is client and client.alive  # the same link
        assert fleet.sessions[0].hello["pid"] == pid
    finally:
        monitor.stop()
        fleet.close()


def test_agent_frozen_before_its_stream_starts_is_unresponsive_not_down() -> None:
    """Frozen between the handshake and the answer to `stream`: the monitor says
    unresponsive within the ping timeout (it used to wait the request's 30 s and call the
    node down), keeps the link, and takes the stream's answer when the agent thaws."""
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.connection.monitor import FleetMonitor
    from areal_console.core.targets.resolve import local_node

    fleet = Fleet([local_node()])
    session = fleet.sessions[0]
    monitor = FleetMonitor(fleet, interval=0.2, ping_every=0.2, ping_timeout=1.0)
    frozen: list[int] = []
    connect = session.connect

    def connect_then_freeze(*args: object, **kwargs: object) -> object:
        hello = connect(*args, **kwargs)  # type: ignore[arg-type]
        if not frozen:  # the first agent only
            frozen.append(int(session.hello["pid"]))
            os.kill(frozen[0], signal.SIGSTOP)
        return hello

    session.connect = connect_then_freeze  # type: ignore[method-assign]
    monitor.start()
    try:
        try:
            view = wait_for(
                lambda: next(
                    (v for v in monitor.snapshot() if v.state not in ("up", "connecting")), None
                ),
                10,
                what="the frozen agent noticed",
            )
            assert view.state == "unresponsive", view
            assert view.error.startswith("agent not responding for ")
            client = session.client
        finally:
            if frozen:
                os.kill(frozen[0], signal.SIGCONT)
        thawed = time.time()
        wait_for(
            lambda: (
                monitor.snapshot()[0].state == "up"
                and (monitor.snapshot()[0].received_at or 0) > thawed
            ),
            30,
            what="the agent back, streaming",
        )
        assert session.client is client and client is not None and client.alive
        assert session.hello["pid"] == frozen[0]  # the same agent, not a new one
    finally:
        monitor.stop()
        fleet.close()


def test_frozen_agent_in_the_cli_says_not_responding(tmp_path: Path) -> None:
    from areal_console.core.connection.client import AgentClient, AgentNotResponding
    from areal_console.core.connection.transport import LocalChannel

    channel = LocalChannel()
    client = AgentClient(channel)
    try:
        client.start(timeout=20)
        os.kill(channel.pid, signal.SIGSTOP)
        try:
            with pytest.raises(AgentNotResponding, match=r"sample: agent not responding for 1 s"):
                client.request("sample", timeout=1.0)
            assert client.alive
        finally:
            os.kill(channel.pid, signal.SIGCONT)
        assert client.request("ping", timeout=10) is not None
    finally:
        client.close()


# --------------------------------------------------------------------------------------
# 3. YAML: alias bombs, huge files, huge values in messages

ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]"
        for i in range(8)
    ]
    + ["nodes: [*i]"]
)


@pytest.mark.parametrize("command", ["inventory", "settings"])
def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path, command: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB + "\n")
    t0 = time.monotonic()
    if command == "inventory":
        result = run_cli("nodes", "--inventory", str(path), timeout=60)
    else:
        result = run_cli("tui", "--local", timeout=60, AREAL_CONSOLE_CONFIG=str(path))
    assert time.monotonic() - t0 < 20
    assert result.returncode == 1, result.stderr
    assert "expands to more than 100,000 values" in result.stderr
    assert len(result.stderr) < 500 and "Traceback" not in result.stderr


def test_huge_inventory_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("nodes:\n" + "  - host-x\n" * 200_000)
    result = run_cli("nodes", "--inventory", str(path))
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == f"error: inventory {path} is larger than 1 MiB: refusing to read it"
    )


def test_huge_values_are_cut_in_messages(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - name: a\n    port: " + "9x" * 150_000 + "\n")
    result = run_cli("nodes", "--inventory", str(path))
    assert result.returncode == 1
    line = result.stderr.strip()
    assert "\n" not in line and len(line) < 700, len(line)
    assert "more characters)" in line


# --------------------------------------------------------------------------------------
# 5 and 12. every command that reaches nodes takes the same target options; an SSH
# server that sends a banner without a newline costs --connect-timeout, not more


@pytest.fixture
def banner_without_newline() -> Iterator[int]:
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            conn.sendall(b"SSH-2.0-evil")  # and never a newline

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize(
    "command",
    [
        ["nodes"],
        ["stacks"],
        ["batch", "/data/step_000001.pt"],
        ["replay", "/data", "--dry-run"],
    ],
)
def test_every_command_honours_ssh_config_and_connect_timeout(
    tmp_path: Path, banner_without_newline: int, command: list[str]
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host fakenode\n  HostName 127.0.0.1\n  Port {banner_without_newline}\n")
    t0 = time.monotonic()
    result = run_cli(
        *command, "--hosts", "fakenode", "--ssh-config", str(config), "--connect-timeout", "1.5"
    )
    elapsed = time.monotonic() - t0
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{banner_without_newline}" in result.stderr  # the config was read
    assert "within 1.5s" in result.stderr and "Traceback" not in result.stderr
    assert elapsed < 8, elapsed


# --------------------------------------------------------------------------------------
# 6. the Slurm hostlist grammar, checked against the real `scontrol show hostnames`

HOSTLISTS = [
    "n[0-1,3]",
    "n[01-03,7]",
    "n[1-010]",
    "n[8-11]",
    "n[001-3]",
    "n[009-011]",
    "n[1,01]",
    "a[1-2]b[3-4]",
    "a[1-2],b[3-4]",
    "a[1-2]b[3-4]c[5-6]",
    "a[1-2]b[3-4]c[5-6]d[7-8]",
    "x[1,3]y[5-6]z[8]",
    "n[1-2][3-4]",
    "n[1-3,5-6,8]",
    "rack1-n[1-2],rack2-n[3]",
    "a,,b",
    "n2,n1,n2",
    "[1-2]",
    "gpu-[0001-0003]",
]


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import shutil

    binary = shutil.which("scontrol")
    if binary is None:
        pytest.skip("scontrol (slurm-wlm) is not installed")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\n")

    def hostnames(expr: str) -> list[str] | None:
        out = subprocess.run(
            [binary, "show", "hostnames", expr],
            capture_output=True,
            text=True,
            env=dict(os.environ, SLURM_CONF=str(conf)),
            timeout=30,
            check=False,
        )
        lines = out.stdout.split()
        return None if (out.returncode or "Invalid hostlist" in out.stdout + out.stderr) else lines

    return hostnames


def test_hostlists_expand_exactly_as_scontrol_does(scontrol: Any) -> None:
    from areal_console.core.targets.inventory import expand_hostlist

    for expr in HOSTLISTS:
        assert expand_hostlist(expr) == scontrol(expr), expr


@pytest.mark.parametrize("expr", ["n[5-3]", "n[a-b]", "n[]", "n[1-2,]", "n[-2]", "n[0-100000]"])
def test_hostlists_scontrol_refuses_are_refused(scontrol: Any, expr: str) -> None:
    from areal_console.core.common.errors import UserError
    from areal_console.core.targets.inventory import expand_hostlist

    assert scontrol(expr) is None
    with pytest.raises(UserError, match="bad host"):
        expand_hostlist(expr)


def test_hosts_option_takes_the_hostlist_grammar() -> None:
    from areal_console.core.targets.inventory import parse_hosts

    specs = parse_hosts("alice@n[0-1,3]:2222,m[08-10]")
    assert [s.address for s in specs] == [
        "alice@n0:2222",
        "alice@n1:2222",
        "alice@n3:2222",
        "m08",
        "m09",
        "m10",
    ]
    bad = run_cli("nodes", "--hosts", "n[3-1]")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "runs backwards" in bad.stderr


# --------------------------------------------------------------------------------------
# 7. an unreadable .pt: that file's error, the rest of the directory summarised

WITHOUT_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture(scope="module")
def dump_with_unreadable_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dump directory whose step 1 file has mode 000. The CLI runs without the
    capabilities that let root read anything, so "permission denied" is real here."""
    from tests.support.fixtures import batch_dumps as bf

    if subprocess.run([*WITHOUT_DAC, "true"], capture_output=True).returncode != 0:
        pytest.skip("setpriv cannot drop capabilities here")
    d = tmp_path_factory.mktemp("dump")
    bf.write_trajectory_dump(d, steps=[0, 1, 2], dp_size=1, n_groups=2, group_size=2)
    (d / "step_000001_dp_0.pt").chmod(0)
    return d


def _batch_cli(*args: str) -> subprocess.CompletedProcess[str]:
    from conftest import cli_env

    return subprocess.run(
        [*WITHOUT_DAC, sys.executable, "-m", "areal_console", "batch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
        check=False,
    )


def test_unreadable_step_is_reported_and_the_directory_summarised(
    dump_with_unreadable_step: Path,
) -> None:
    import json

    result = _batch_cli(str(dump_with_unreadable_step), "--json")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"warning: {dump_with_unreadable_step}/step_000001_dp_0.pt: cannot read: Permission denied"
    )
    doc = json.loads(result.stdout)
    errors = {e["file"]: e.get("error") for e in doc["timeline"]}
    assert errors["step_000000_dp_0.pt"] is None and errors["step_000002_dp_0.pt"] is None
    assert "Permission denied" in errors["step_000001_dp_0.pt"]
    assert doc["samples"] == 8  # the two readable steps, 2 groups x 2 samples each


def test_unreadable_file_alone_is_one_line(dump_with_unreadable_step: Path) -> None:
    path = dump_with_unreadable_step / "step_000001_dp_0.pt"
    result = _batch_cli(str(path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {path}: cannot read: Permission denied"


# --------------------------------------------------------------------------------------
# 8. a malformed saved capture among good ones


def test_stacks_list_names_the_bad_capture_and_lists_the_rest(tmp_path: Path) -> None:
    import json

    from areal_console.core.stacks.records import StackCapture
    from areal_console.core.stacks.store import save_capture

    data = tmp_path / "data"
    captures = data / "captures"
    good = StackCapture(captured_at="2026-01-01T00:00:00+00:00", samples=1, ranks=[], errors=[])
    good.capture_id = "20260101-000000-good"
    save_capture(good, captures)
    (captures / "20260101-000001-list.json").write_text("[1, 2, 3]")
    (captures / "20260101-000002-ranks.json").write_text('{"ranks": [1, 2]}')
    (captures / "20260101-000003-text.json").write_text("{not json")
    os.mkfifo(captures / "20260101-000004-fifo.json")
    t0 = time.monotonic()
    result = run_cli("stacks", "--list", "--json", AREAL_CONSOLE_DATA_DIR=str(data))
    assert time.monotonic() - t0 < 30
    assert result.returncode == 0, result.stderr
    assert [c["id"] for c in json.loads(result.stdout)["captures"]] == ["20260101-000000-good"]
    warned = sorted(line.split(":")[1].strip() for line in result.stderr.splitlines())
    assert warned == sorted(
        f"skipped {captures}/20260101-00000{i}-{name}.json"
        for i, name in enumerate(["list", "ranks", "text", "fifo"], start=1)
    )
    opened = run_cli(
        "stacks", "--open", str(captures / "20260101-000002-ranks.json"),
        AREAL_CONSOLE_DATA_DIR=str(data),
    )  # fmt: skip
    assert opened.returncode == 1 and "Traceback" not in opened.stderr
    assert "is not a valid stack capture" in opened.stderr


# --------------------------------------------------------------------------------------
# 10. the CLI contract: exit codes, warnings, bad values, noise, random bytes


@pytest.mark.parametrize(
    "args",
    [
        ["nodes", "--connect-timeout", "0"],
        ["nodes", "--connect-timeout", "-3"],
        ["nodes", "--connect-timeout", "nan"],
        ["nodes", "--hosts", "node:22.7"],
        ["nodes", "--hosts", "node:0"],
        ["nodes", "--samples", "0"],
        ["nodes", "--samples", "2", "--interval", "nan"],
        ["nodes", "--samples", "2", "--interval", "0"],
        ["stacks", "--samples", "0"],
        ["stacks", "--match", "("],
        ["stacks", "--interval", "-1"],
        ["metrics", "/tmp", "--follow", "--interval", "nan"],
        ["metrics", "/tmp", "--follow", "--interval", "inf"],
        ["tui", "--interval", "nan"],
        ["batch", "x.pt", "--sample", "-1"],
        ["replay", "/tmp", "--gpus", "zero"],
        ["replay", "/tmp", "--steps", "5:2"],
        ["slurm", "12,rm"],
    ],
)
def test_bad_values_exit_2_in_one_line(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_inventory_port_that_is_not_a_whole_number(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - name: a\n    port: 22.7\n")
    result = run_cli("nodes", "--inventory", str(path))
    assert result.returncode == 1
    assert (
        result.stderr.strip() == f"error: {path}:3: bad port 22.7 in 'node': must be a whole number"
    )


def test_stacks_with_no_node_answering_is_one_error_line_and_nothing_saved(
    tmp_path: Path,
) -> None:
    data = {"AREAL_CONSOLE_DATA_DIR": str(tmp_path / "data")}
    result = run_cli("stacks", "--hosts", "127.0.0.1:1", "--connect-timeout", "2", **data)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(
        "error: no node answered (1 tried): 127.0.0.1: connection refused by 127.0.0.1:1"
    )
    assert result.stderr.count("\n") == 1
    result = run_cli("stacks", "--hosts", "nosuchhost.invalid", **data)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert result.stderr.startswith(
        "error: no node answered (1 tried): nosuchhost.invalid: cannot resolve host name"
    )
    listed = run_cli("stacks", "--list", **data)
    assert listed.returncode == 0 and listed.stdout == "no saved captures\n"


def test_stacks_with_no_rank_captured_is_one_error_line_and_nothing_saved(
    tmp_path: Path,
) -> None:
    data = {"AREAL_CONSOLE_DATA_DIR": str(tmp_path / "data")}
    for json_flag in ([], ["--json"]):
        result = run_cli("stacks", "--local", "--match", "no-such-process-zq81", *json_flag, **data)
        assert result.returncode == 1, result.stderr
        assert result.stdout == ""
        assert result.stderr == (
            "error: no rank captured: no process with rank variables matches --match "
            "'no-such-process-zq81'\n"
        )
    listed = run_cli("stacks", "--list", "--json", **data)
    assert listed.returncode == 0 and '"captures": []' in listed.stdout


def test_nodes_partial_failure_is_a_warning_not_an_error() -> None:
    from areal_console.commands.nodes import outcome

    result = run_cli("nodes", "--hosts", "127.0.0.1:1,127.0.0.2:1", "--connect-timeout", "2")
    assert result.returncode == 1  # every node down: an error
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error: 127.0.0.") for line in lines)
    nodes = [
        {"name": "up1", "state": "up", "error": None},
        {"name": "down1", "state": "down", "error": "connection refused"},
    ]
    assert outcome(nodes) == (3, ["warning: down1: connection refused"])


def test_random_bytes_are_not_a_torch_file(tmp_path: Path) -> None:
    """4 KB of random bytes, starting as a pickle would: not a torch file, not "unsafe"."""
    import random

    rng = random.Random(7)
    for name, head in (("a.pt", b"\x80\x02"), ("b.pt", b"\x80\x04"), ("c.pt", b"")):
        path = tmp_path / name
        path.write_bytes(head + bytes(rng.getrandbits(8) for _ in range(4096 - len(head))))
        result = run_cli("batch", str(path))
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip() == (
            f"error: {path}: not a torch.save file (neither a zip archive nor torch's "
            "legacy format)"
        )


def test_batch_prints_no_torch_warnings(tmp_path: Path) -> None:
    from tests.support.fixtures import batch_dumps as bf

    bf.write_trajectory_dump(tmp_path, steps=[0], dp_size=1, n_groups=2, group_size=2)
    result = run_cli("batch", str(tmp_path / "step_000000_dp_0.pt"))
    assert result.returncode == 0 and result.stderr == "", result.stderr


# --------------------------------------------------------------------------------------
# 11. templates: fields are filled in the template, never inside the values

WRITE_ARGS = "import sys; open(sys.argv[2], 'w').write(sys.argv[1] + chr(10) + sys.argv[3])"


def test_a_dump_path_holding_a_field_name_is_passed_as_it_is(tmp_path: Path) -> None:
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.replay import runs as jobs
    from areal_console.core.replay.plan import parse_template, plan_replay
    from areal_console.core.slurm import runs as slurm_runs
    from areal_console.core.targets.resolve import local_node

    from tests.support.fixtures import batch_dumps as bf

    dump = tmp_path / "run-{job_dir}-{python}"
    dump.mkdir()
    bf.write_trajectory_dump(dump, steps=[0], dp_size=1, n_groups=2, group_size=2)
    template = parse_template(
        "probe", {"argv": f'{{python}} -c "{WRITE_ARGS}" {{dir}} {{job_dir}}/seen'}
    )
    fleet = Fleet([local_node()])
    session = fleet.sessions[0]
    try:
        index = jobs.dump_index(session, str(dump))
        plan = plan_replay(
            index, session.name, session.call("sample"), template, gpus=[],
            python=sys.executable, overrides=["note={job_dir}"],
        )  # fmt: skip
        assert str(dump) in plan.command_line  # shown as it will run
        record = jobs.launch(session, plan)
        record = jobs.wait(session, record, timeout=60)
        assert record.state == "finished", record
        seen = (Path(str(record.job_dir)) / "seen").read_text().splitlines()
        assert seen == [str(dump), "note={job_dir}"]
        # The Slurm form resolves the same way.
        argv = slurm_runs.slurm_command(plan, "/jobs/j1")
        assert str(dump) in argv and "/jobs/j1/seen" in argv and "note={job_dir}" in argv
    finally:
        fleet.close()


# --------------------------------------------------------------------------------------
# 12. bounded waits that the user sets: Slurm's own commands


@pytest.mark.parametrize("command", [("nodes", "--slurm-job", "42"), ("slurm",)])
def test_slurm_timeout_bounds_slurms_commands(tmp_path: Path, command: tuple[str, ...]) -> None:
    """A Slurm controller that never answers: `--slurm-timeout` bounds the wait on
    `scontrol`/`squeue` (default 30 s), with a one-line error naming the command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "squeue"):
        hung = bin_dir / name
        hung.write_text("#!/bin/sh\nexec sleep 120\n")
        hung.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    t0 = time.monotonic()
    result = run_cli(*command, "--slurm-timeout", "1.5", PATH=path)
    elapsed = time.monotonic() - t0
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "no answer within 1.5s" in result.stderr
    assert elapsed < 15, f"took {elapsed:.1f}s"


# --------------------------------------------------------------------------------------
# Cases that need the sshd test cluster or the Slurm cluster live with those fixtures:

ELSEWHERE = {
    "cluster/test_ssh.py": [
        "test_known_hosts_markers_revoke_one_host_and_fail_no_other",  # 4
        "test_known_hosts_warning_is_shown_once_in_the_console",  # 4
        "test_connect_timeout_bounds_the_agent_start",  # 12
    ],
    "cluster/test_fleet_faults.py": [
        "test_hung_agent_costs_only_its_own_timeout",  # 13, over SSH
    ],
    "cluster/test_slurm.py": [
        "test_the_agents_python_is_chosen_on_the_node",  # 14 (and 9 through Slurm)
        "test_unknown_job_is_a_clear_error",  # 10: a bad job id exits 2
    ],
}


def test_the_cases_listed_elsewhere_exist() -> None:
    import ast

    here = Path(__file__).parents[1]
    for module, names in ELSEWHERE.items():
        tree = ast.parse((here / module).read_text())
        defined = {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        assert set(names) <= defined, (module, set(names) - defined)


def test_known_hosts_notes_are_said_once_per_process() -> None:
    """Every reconnect reads known_hosts again: its warnings are said once, not per connect
    (item 4)."""
    from areal_console.core.connection import ssh

    ssh.take_notes()
    ssh._note("known_hosts: 1 @cert-authority line(s) skipped")
    assert ssh.take_notes() == ["known_hosts: 1 @cert-authority line(s) skipped"]
    ssh._note("known_hosts: 1 @cert-authority line(s) skipped")  # the next connect
    assert ssh.take_notes() == []


@pytest.mark.parametrize(
    ("word", "line"),
    [
        ("stack", "error: unknown command 'stack' (did you mean 'stacks'?)"),
        ("replya", "error: unknown command 'replya' (did you mean 'replay'?)"),
        (
            "xyzzy",
            "error: unknown command 'xyzzy' (commands: tui, demo, nodes, stacks, "
            "batch, trainer, replay, slurm, metrics, report, watch)",
        ),
    ],
)
def test_unknown_command_names_the_closest_one(word: str, line: str) -> None:
    result = run_cli(word, "--local")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["stacks", "--samles", "2"],
            "error: areal-console stacks: unrecognized arguments: --samles 2 "
            "(did you mean '--samples'?)",
        ),
        (["report", "--bogus"], "error: areal-console report: unrecognized arguments: --bogus"),
        (["replay"], "error: areal-console replay: the following arguments are required: path"),
    ],
)
def test_bad_arguments_are_named_by_their_command(args: list[str], line: str) -> None:
    """argparse names the top-level parser for an unknown option ("areal-console:"), and
    lists an optional `key=value` list as required: the command is named, the closest
    option offered, and only what is missing is said."""
    result = run_cli(*args)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


def test_overrides_after_an_option_are_overrides() -> None:
    """`replay DIR --wait actor.eps_clip=0.1`: argparse leaves a `key=value` after an
    option over as unrecognized; it is an override like one before the options."""
    result = run_cli("replay", "/nonexistent", "--gpus", "cpu", "actor.eps_clip=0.1", "--json")
    assert result.returncode == 1, result.stderr
    assert "unrecognized" not in result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "no dump directory at /nonexistent" in result.stderr
