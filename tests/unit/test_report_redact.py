"""Masking secrets and anonymizing: every shape a credential takes in argv, environment,
config and logs; names that only look like secrets left alone; aliases consistent."""

from __future__ import annotations

import json

import pytest
from areal_console.core.report.bundle import build_report, tar_bytes
from areal_console.core.report.model import LogTail, ReportInputs
from areal_console.core.report.redact import Redactor, is_secret_name


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
