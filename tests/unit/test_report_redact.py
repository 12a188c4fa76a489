"""Masking secrets and anonymizing: every shape a credential takes in argv, environment,
config and logs; names that only look like secrets left alone; aliases consistent."""

from __future__ import annotations

import json

import pytest
from areal_console.core.report.bundle import build_report, tar_bytes
from areal_console.core.report.model import LogTail, ReportInputs
from areal_console.core.report.redact import Redactor, is_secret_name
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("raw", "masked"),
    [
        ("WANDB_API_KEY=0123456789abcdef0123", "WANDB_API_KEY=***"),
        ("env HF_TOKEN=hf_abcdefghijklmnopqrstuvwx python", "env HF_TOKEN=*** python"),
        ("RAY_AUTH_TOKEN='s3cr3tvalue' ray start", "RAY_AUTH_TOKEN=*** ray start"),
        ("--api-key sk-proj-abcdefghijklmnopqrstuv", "--api-key ***"),
        ("--redis-password=hunter2hunter2", "--redis-password=***"),
        ("stats_logger.wandb.wandb_api_key=abcd1234efgh", "stats_logger.wandb.wandb_api_key=***"),
        ("    wandb_api_key: abcd1234efgh", "    wandb_api_key: '***'"),
        ('{"openai_api_key": "sk-abcdefghijklmnopqrstuvwx"}', '{"openai_api_key": "***"}'),
        ("https://bob:pa55word@wandb.example.com/x", "https://bob:***@wandb.example.com/x"),
        ("Authorization: Bearer abcdefghijklmnop123", "Authorization: Bearer ***"),
        ("pushed with ghp_abcdefghijklmnopqrstuvwxyz0123", "pushed with ***(token)"),
    ],
)
def test_named_and_shaped_secrets_are_masked_with_their_name(raw: str, masked: str) -> None:
    r = Redactor()
    r.learn(raw)
    assert r.text(raw) == masked


@pytest.mark.parametrize(
    "text",
    [
        "gconfig.max_new_tokens=512 pad_token: <pad> eos_token=</s>",
        "tokenizer_path: /models/qwen sort_key=len",
        "commit 0123456789abcdef0123456789abcdef01234567",
        "http://127.0.0.1:30000/health",
    ],
)
def test_names_that_only_look_like_secrets_are_kept(text: str) -> None:
    r = Redactor()
    r.learn(text)
    assert r.text(text) == text


def test_a_learned_secret_is_masked_wherever_it_appears_again() -> None:
    r = Redactor()
    r.learn("wandb_api_key: 'abcdef0123456789'")
    assert r.text("netrc: abcdef0123456789 written") == "netrc: ***(wandb_api_key) written"
    assert is_secret_name("WANDB_API_KEY") and not is_secret_name("max_new_tokens")


def test_data_masks_values_of_secret_keys_and_every_string() -> None:
    r = Redactor()
    doc = {"env": {"HF_TOKEN": "hf_x1234", "NCCL_DEBUG": "INFO"}, "cmd": ["--token=abcd1234"]}
    r.learn_data(doc)
    out = r.data(doc)
    assert out == {"env": {"HF_TOKEN": "***", "NCCL_DEBUG": "INFO"}, "cmd": ["--token=***"]}


def test_a_local_variable_named_as_a_secret_is_masked_with_its_value_elsewhere() -> None:
    r = Redactor()
    doc = {"locals": [[{"name": "hf_token", "repr": "'abcd1234xyz'", "arg": True},
                       {"name": "step", "repr": "3", "arg": False}]]}  # fmt: skip
    r.learn_data(doc)
    assert r.data(doc)["locals"][0] == [{"name": "hf_token", "repr": "***", "arg": True},
                                        {"name": "step", "repr": "3", "arg": False}]  # fmt: skip
    assert r.text("login abcd1234xyz") == "login ***(hf_token)"


def test_anonymize_replaces_hosts_ips_and_users_consistently() -> None:
    r = Redactor(anonymize=True)
    r.learn_hosts(["gpu-node-07", "gpu-node-08"])
    r.learn_users(["alice"])
    text = ("alice@gpu-node-07:/home/alice/logs/alice/exp 10.1.2.3 -> 10.1.2.4 "
            "gpu-node-07 again 10.1.2.3; alice in prose stays")  # fmt: skip
    out = r.text(text)
    assert out == ("user-1@host-1:/home/user-1/logs/user-1/exp ip-1 -> ip-2 "
                   "host-1 again ip-1; alice in prose stays")  # fmt: skip


def test_bundle_is_cut_to_its_bound_and_says_so() -> None:
    noise = "".join(f"line {i} {i * 7919 % 104729:x}{i * 31337 % 65521:x}\n" for i in range(40000))
    inputs = ReportInputs(job="e/t", made_at="now", log_dir="/logs",
                          logs=[LogTail("n1", "/logs/actor.log", noise.splitlines()[-5:], noise,
                                        len(noise))])  # fmt: skip
    bound = 64 * 1024
    report = build_report(inputs, Redactor(), bound)
    files = {f.name: f.data for f in report.files}
    assert len(tar_bytes(report.files)) <= bound
    assert report.cut == [f"logs/n1/actor.log: only its last {len(files['logs/n1/actor.log'])} "
                          "bytes kept"]  # fmt: skip
    assert files["logs/n1/actor.log"].endswith(
        b"line 39999 " + noise.splitlines()[-1].split()[-1].encode() + b"\n"
    )
    assert b"cut to fit the bound:" in files["MANIFEST.txt"]
    assert json.loads(json.dumps(report.missing)) == {}


@pytest.mark.parametrize(
    ("raw", "masked"),
    [
        # A parent key's line never swallows the next: AReaL's nested admin_api_key.
        ("rollout:\n  agent:\n    admin_api_key: ADMINKEY123\n    x: 1\n",
         "rollout:\n  agent:\n    admin_api_key: '***'\n    x: 1\n"),
        ("wandb:\n  ApiKey: mykey123456\n", "wandb:\n  ApiKey: '***'\n"),
        ("GET /v1?api_key=S3CRETVALUE123&x=1 200", "GET /v1?api_key=***&x=1 200"),
        ("redis://:secretpw123@10.0.0.1:6379/0", "redis://:***@10.0.0.1:6379/0"),
        ("password = hunter2hunter2", "password = ***"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG", "aws_secret_access_key = ***"),
        ("{'api_key': 'pyrepr_secret_123'}", "{'api_key': '***'}"),
        ("  - --wandb.api_key=abcd1234secret", "  - --wandb.api_key=***"),
        ("--hf_token=hf_short1234", "--hf_token=***"),
        ("Authorization: sk-abcdef", "Authorization: '***'"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNzd29yZA==", "Proxy-Authorization: Basic ***"),
        ("url: https://maps.example/?key=AIzaSyA1234567890abcdefghijklmnopqrstuv",
         "url: https://maps.example/?key=***(token)"),
    ],
)  # fmt: skip
def test_secrets_in_unusual_places_are_masked(raw: str, masked: str) -> None:
    r = Redactor()
    r.learn(raw)
    assert r.text(raw) == masked


def test_a_json_escaped_secret_is_masked_where_a_log_echoes_it_unescaped() -> None:
    config = '{"wandb": {"api_key": "abc\\"quoted\\\\secret12"}}'
    r = Redactor()
    r.learn(config)
    assert r.text(config) == '{"wandb": {"api_key": "***"}}'
    assert r.text('login abc"quoted\\secret12 ok') == "login ***(api_key) ok"


def test_bundle_member_names_from_hostile_node_and_log_names_stay_inside(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import tarfile

    from areal_console.core.report.bundle import write_report

    hostile = ["..", ".", "/etc", "a\0b", "n" * 5000, "../../x", "\x1b]0;t\x07"]
    logs = [LogTail(node, f"/logs/{i}.log", ["x"], "x\n", 2) for i, node in enumerate(hostile)]
    logs.append(LogTail("n1", "/logs/..", ["y"], "y\n", 2))
    report = build_report(ReportInputs(job="e/t", made_at="now", logs=logs), Redactor())
    bundle, _ = write_report(report, str(tmp_path / "r.md"))
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "out", filter="data")
    assert len([n for n in names if n.startswith("report/logs/")]) == len(logs)
    for name in names:
        parts = name.split("/")
        assert parts[0] == "report" and "\0" not in name and "\x1b" not in name
        assert not {".", "..", ""} & set(parts) and max(map(len, parts)) <= 96, name


def test_escape_sequences_from_processes_and_logs_never_reach_the_report_raw() -> None:
    import re

    evil = "\x1b]2;pwned\x07\x1b[2J\u202e"
    inputs = ReportInputs(
        job="e/t" + evil, made_at="now", log_dir="/l" + evil,
        processes=[{"node": "n1", "pid": 1, "rank": 0, "role": "controller", "state": "ok",
                    "cmdline": "python -m areal.launcher --config /x" + evil}],
        logs=[LogTail("n1", "/l/main.log", ["line " + evil], "line " + evil + "\n", 10)],
        config_text="a: 1" + evil + "\n", missing={"versions": "n1: " + evil},
    )  # fmt: skip
    report = build_report(inputs, Redactor())
    raw = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
    assert not raw.search(report.markdown) and "\\x1b]2;pwned" in report.markdown
    for f in report.files:
        assert not raw.search(f.data.decode()), f.name
    processes = next(f for f in report.files if f.name == "processes.json")
    assert json.loads(processes.data)[0]["cmdline"].endswith(evil)  # JSON keeps the text


def test_anonymize_covers_hosts_the_environment_names_and_the_processes_user() -> None:
    from areal_console.core.report.model import NodeVersions
    from areal_console.core.report.redact import learn_identities

    env = {"MASTER_ADDR": "gpu-node-08", "SLURM_JOB_NODELIST": "gpu-node-[07-09]"}
    inputs = ReportInputs(
        job="e/t", made_at="now", log_dir="gpu-node-07:/fr/logs/alice/e/t",
        processes=[{"node": "gpu-node-07", "pid": 1, "rank": 0, "state": "ok", "user": "alice",
                    "cmdline": "python t.py MASTER_ADDR=gpu-node-08 --host gpu-node-09"}],
        logs=[LogTail("gpu-node-07", "/fr/logs/alice/e/t/main.log", ["x"],
                      "from 10.1.2.3 on gpu-node-09 in gpu-node-[07-09]\n", 10)],
        versions=[NodeVersions("gpu-node-07", {}, [{"environment": env}])],
    )  # fmt: skip
    r = Redactor(anonymize=True)
    learn_identities(r, inputs)
    report = build_report(inputs, r)
    texts = [report.markdown] + [f.name + "\n" + f.data.decode() for f in report.files]
    for text in texts:
        for name in ("gpu-node-0", "alice", "10.1.2.3"):
            assert name not in text, (name, text[:300])
    processes = json.loads(next(f.data for f in report.files if f.name == "processes.json"))
    assert processes[0]["user"] == r.users["alice"]
    assert r.hosts["gpu-node-[07-09]"] in report.markdown


# Partial leaks: a masking test fails when any 8 characters of the planted secret are left,
# not only the whole (a value cut at a quote, a space or a line end leaks its head).
PIECE = 8


def leaked_pieces(secret: str, text: str) -> list[str]:
    return [
        secret[i : i + PIECE]
        for i in range(len(secret) - PIECE + 1)
        if secret[i : i + PIECE] in text
    ]


SHAPES = (
    "HF_TOKEN={s} python train.py",
    "env WANDB_API_KEY='{s}' torchrun",
    "--api-key {s} --port 1",
    "--redis-password={s}",
    "  wandb_api_key: {s}",
    "rollout:\n  agent:\n    admin_api_key: {s}\n    x: 1\n",
    "  - token:   {s}   \r\n",
    '{{"openai_api_key": "{s}"}}',
    "{{'api_key': '{s}'}}",
    "https://bob:{s}@wandb.example.com/x",
    "Authorization: Bearer {s}",
    "password = {s}",
    "GET /v1?api_key={s}&x=1 200",
    "redis://:{s}@10.0.0.1:6379/0",
)


@given(
    shape=st.sampled_from(SHAPES),
    secret=st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
                   min_size=PIECE, max_size=48),
    pad=st.sampled_from(["", " " * 5000, "\t" * 300, "a: b" + " " * 3000 + "c\n"]),
)  # fmt: skip
def test_no_piece_of_a_planted_secret_is_left(shape: str, secret: str, pad: str) -> None:
    """Each shape a credential takes, with a random secret, among long runs of spaces:
    neither the secret nor any 8 characters of it reach the report; a log echoing it
    elsewhere is masked too."""
    text = f"{pad}\n{shape.format(s=secret)}\n{pad}\nlater: echoed {secret} in a log\n"
    r = Redactor()
    r.learn(text)
    out = r.text(text)
    assert not leaked_pieces(secret, out), out[-400:]


def test_a_partial_leak_is_caught() -> None:
    """The check itself: a value masked only up to a character leaves pieces."""
    assert leaked_pieces("abcdefghijkl", "x=***ijkl y") == []
    assert leaked_pieces("abcdefghijkl", "x=***(cut)efghijkl") == ["efghijkl"]
