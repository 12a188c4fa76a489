"""Every file:line of AReaL that the test transcriptions cite, checked against AReaL.

The transcriptions (tests/support/fixtures/areal_code.py, tests/support/fixtures/batch_dumps.py,
tests/support/areal_logfmt.py, and the tests that read them) cite AReaL as `areal/...py:A-B`
(always the full path). `CITES` lists each citation with the text of its first line and a
digest of all its lines at the cited commit (cbff54d, or PR #1407's head for the trajectory
dump), so a number that drifts, or code that moves, fails here:

- always: every citation in those files is in `CITES` (and none uses a short path);
- always, on the `areal 1.0.4` release: the citations into files 1.0.4 has byte for byte as
  they are at cbff54d (their git blob ids, `CITED_FILE_BLOBS`), line for line;
- with `$AREAL_REPO` (a checkout with both commits): every citation and every blob id.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import areal_checkout
from tests.support.areal_source import (
    AREAL_RELEASE,
    CITED_COMMIT,
    PR_1407_COMMIT,
    AReaLSource,
    ReleaseSource,
    git_blob_id,
)

TESTS = Path(__file__).resolve().parents[1]
CITING_FILES = [
    TESTS / "support" / "fixtures" / "areal_code.py",
    TESTS / "support" / "fixtures" / "batch_dumps.py",
    TESTS / "support" / "areal_logfmt.py",
    TESTS / "unit" / "test_metrics_core.py",
    TESTS / "unit" / "test_batches_areal.py",
]
CITATION = re.compile(r"(?<![\w/])(areal/[\w/]+\.py):\s*(\d+)(?:-(\d+))?")
ANY_CITATION = re.compile(r"([\w/.]*\w\.py):\s*\d|\(:\d")
PR_1407 = PR_1407_COMMIT


@dataclass(frozen=True)
class Cite:
    path: str
    first: int
    last: int
    first_line: str  # stripped
    digest: str  # sha256 of lines first..last joined by newlines, first 16 hex digits
    commit: str = CITED_COMMIT


CITES = [
    Cite("areal/api/cli_args.py", 3048, 3049, "fileroot: str = field(", "2cc73108a0b62b81"),
    Cite(
        "areal/engine/fsdp_engine.py",
        725,
        725,
        'grad_norm=float(grad_norm) if grad_norm is not None else float("nan"),',
        "261738cde1a6df22",
    ),
    Cite(
        "areal/experimental/openai/types.py",
        206,
        209,
        "logprobs = [0.0] * resp.input_len + resp.output_logprobs",
        "3cc143cb647d35a7",
    ),
    Cite(
        "areal/experimental/openai/types.py",
        206,
        225,
        "logprobs = [0.0] * resp.input_len + resp.output_logprobs",
        "999d63236af5d94a",
    ),
    Cite(
        "areal/infra/launcher/local.py",
        115,
        118,
        "def log_path_of(self, job_name: str) -> str:",
        "25ab0645b73a6ea7",
    ),
    Cite(
        "areal/infra/launcher/local.py",
        148,
        148,
        'c = f"{c} 2>&1 | tee -a {self.log_path_of(job_name)}"',
        "bbaf2ed165412ad7",
    ),
    Cite("areal/infra/launcher/local.py", 409, 409, 'job_name="trainer",', "241411ca2d617621"),
    Cite(
        "areal/infra/remote_inf_engine.py",
        162,
        162,
        "concatenated = concat_padded_tensors(valid_results)",
        "32e2d8d03107f595",
    ),
    Cite(
        "areal/infra/remote_inf_engine.py",
        165,
        213,
        "def _normalize_group_rewards(",
        "61fb657252e488e0",
    ),
    Cite(
        "areal/infra/remote_inf_engine.py",
        194,
        197,
        "rewards = torch.tensor(reward_per_result, dtype=torch.float32)",
        "d8bbf444b035893e",
    ),
    Cite(
        "areal/infra/rpc/guard/engine_blueprint.py",
        607,
        609,
        "if not is_train or not is_init or engine.is_data_parallel_head():",
        "8466578328db80f0",
    ),
    Cite("areal/infra/rpc/rtensor.py", 68, 84, "@dataclass", "a733cb0c828c6923"),
    Cite("areal/infra/rpc/rtensor.py", 351, 354, "@dataclass", "f08e461cf04cb29e"),
    Cite("areal/infra/rpc/rtensor.py", 371, 424, "@staticmethod", "8b36af401b11c8af"),
    Cite("areal/infra/utils/proc.py", 104, 119, "full_cmd = build_target_cmd(", "a65c2cedf5734ccb"),
    Cite(
        "areal/infra/utils/proc.py",
        112,
        119,
        'log_prefix = f"[{role}]".ljust(LOG_PREFIX_WIDTH)',
        "05b02bcc75fb1d8f",
    ),
    Cite("areal/infra/workflow_executor.py", 215, 216, "else:", "61085592868218cd"),
    Cite(
        "areal/trainer/ppo/actor.py",
        167,
        172,
        "def _compute_logp(self, data: dict[str, Any]) -> torch.Tensor | None:",
        "4f52f3d4bca33b43",
    ),
    Cite(
        "areal/trainer/ppo/actor.py",
        214,
        215,
        'loss_mask = data["loss_mask"].float()',
        "3bf2de87efddca99",
    ),
    Cite(
        "areal/trainer/ppo/actor.py",
        239,
        239,
        'old_logp = torch.roll(data["logprobs"], shifts=-1, dims=-1)',
        "3897d0c14003faba",
    ),
    Cite("areal/trainer/ppo/actor.py", 396, 439, "global_denominators = dict(", "97b687d684f7c99b"),
    Cite(
        "areal/trainer/ppo/actor.py",
        419,
        419,
        "no_eos_ratios=(seqlens == attn_mask.shape[-1]).float(),",
        "33687716720cd79f",
    ),
    Cite(
        "areal/trainer/ppo/actor.py",
        459,
        484,
        'with stats_tracker.scope("update"):',
        "8885b160e41a1bb0",
    ),
    Cite("areal/trainer/ppo/actor.py", 661, 711, "# Log training statistics", "5b8c0d11467aba54"),
    Cite(
        "areal/trainer/rl_trainer.py",
        758,
        764,
        "teacher_logps = self.teacher.compute_logp(rollout_batch)",
        "1d66fe0d590d3434",
    ),
    Cite(
        "areal/trainer/rl_trainer.py",
        803,
        809,
        "teacher_logps = self.teacher.compute_logp(rollout_batch)",
        "85ce8e39d3f19219",
        PR_1407,
    ),
    Cite(
        "areal/trainer/rl_trainer.py",
        1371,
        1383,
        "def _trajectory_path(self, step: int) -> str:",
        "b8f1e0718bd489c2",
        PR_1407,
    ),
    Cite(
        "areal/trainer/rl_trainer.py",
        1371,
        1388,
        "def _trajectory_path(self, step: int) -> str:",
        "43f41859fca72ca2",
        PR_1407,
    ),
    Cite(
        "areal/trainer/rl_trainer.py",
        1385,
        1388,
        "def _save_trajectory(self, batch: list[dict[str, torch.Tensor]], step: int) -> None:",
        "c610191cb6730569",
        PR_1407,
    ),
    Cite(
        "areal/utils/data.py",
        27,
        47,
        "def get_batch_size(data: dict[str, Any]) -> int:",
        "c2d4c4bff1241dc6",
    ),
    Cite(
        "areal/utils/data.py",
        88,
        90,
        "def is_multi_modal_key(key: str) -> bool:",
        "8bc7cb686d65edbe",
    ),
    Cite(
        "areal/utils/data.py",
        204,
        238,
        "def _pad_cat_dim0(tensors: list[torch.Tensor], pad_value: float = 0.0) -> torch.Tensor:",
        "637a22636eae2528",
    ),
    Cite("areal/utils/data.py", 241, 298, "def concat_padded_tensors(", "0d57dbba8d668300"),
    Cite("areal/utils/data.py", 301, 310, "def _unpad_splits(", "1513d95817056c56"),
    Cite("areal/utils/data.py", 313, 357, "def split_and_unpad_tensor(", "09239dc46acdba67"),
    Cite("areal/utils/data.py", 369, 390, "def concat_batch(", "68858bcdcb500873"),
    Cite(
        "areal/utils/logging.py",
        15,
        22,
        'AREAL_HEADER = "\\033[1;38;2;180;140;80m(AReaL)\\033[0m"  # Bold milk tea color',
        "15134fa1a43fe556",
    ),
    Cite("areal/utils/logging.py", 38, 133, "LOGGER_COLORS_EXACT = {", "4bbde82314af90b6"),
    Cite("areal/utils/logging.py", 60, 60, '"StatsLogger": "light_green",', "58c8221f163acbf5"),
    Cite("areal/utils/logging.py", 76, 76, '"RLTrainer": "light_green",', "5cf6dc5d91660c16"),
    Cite(
        "areal/utils/logging.py",
        159,
        164,
        "class StreamingFileHandler(FileHandler):",
        "5906ab91cc43ad10",
    ),
    Cite(
        "areal/utils/logging.py",
        167,
        212,
        "class LoggerColoredFormatter(colorlog.ColoredFormatter):",
        "a81e0fc3b3525036",
    ),
    Cite(
        "areal/utils/logging.py", 197, 212, "def formatMessage(self, record):", "b3baed710797a452"
    ),
    Cite("areal/utils/logging.py", 218, 229, '"plain": {', "6056ae42e129a589"),
    Cite("areal/utils/logging.py", 268, 273, '"plainHandler": {', "6fc438b745f300ba"),
    Cite("areal/utils/logging.py", 415, 484, "def setup_file_logging(", "0ce3e6e477bab5ed"),
    Cite(
        "areal/utils/printing.py",
        6,
        21,
        'def tabulate_stats(data: dict[str, float], col=4, floatfmt=".4e") -> str:',
        "de7c8af5e1f44204",
    ),
    Cite("areal/utils/stats_logger.py", 122, 133, "def close(self):", "86e5b7be6ea638fa"),
    Cite(
        "areal/utils/stats_logger.py",
        135,
        162,
        "def commit(self, epoch: int, step: int, global_step: int, data: dict | list[dict]):",
        "760425e99c1c1803",
    ),
    Cite(
        "areal/utils/stats_logger.py",
        145,
        159,
        "log_step = max(global_step, self._last_commit_step + 1)",
        "f3e82d4cbe1c8db4",
    ),
    Cite(
        "areal/utils/stats_tracker.py",
        104,
        105,
        '# NOTE: timing records are fixed under the "timeperf" scope',
        "89d23ac8c2469f8a",
    ),
    Cite(
        "areal/utils/stats_tracker.py",
        363,
        372,
        "if reduce_type == ReduceType.AVG_MIN_MAX:",
        "ee882a602463d3c1",
    ),
    Cite(
        "areal/workflow/rlvr.py",
        135,
        135,
        "stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward)",
        "27a01f16e5f93dfe",
    ),
    Cite(
        "areal/workflow/rlvr.py",
        164,
        180,
        "# Build result tensor dict with batch dim 1",
        "628334a47e8f63fc",
    ),
    Cite(
        "areal/workflow/rlvr.py",
        165,
        169,
        "seq = resp.input_tokens + resp.output_tokens",
        "4417dc3ed613b736",
    ),
    Cite(
        "areal/workflow/vision_rlvr.py",
        141,
        146,
        "seq = resp.input_tokens + resp.output_tokens",
        "caa0de4148320db8",
    ),
    Cite(
        "areal/workflow/vision_rlvr.py",
        141,
        169,
        "seq = resp.input_tokens + resp.output_tokens",
        "282a717869306b35",
    ),
]

# Key lines the transcriptions rest on, at the cited commit.
KEY_LINES = [
    ("areal/workflow/rlvr.py", 172, '"input_ids": torch.tensor(seq, dtype=torch.int32),', CITED_COMMIT),
    ("areal/workflow/rlvr.py", 180, "return {k: v.unsqueeze(0) for k, v in res.items()}", CITED_COMMIT),
    ("areal/workflow/vision_rlvr.py", 164, '"multi_modal_input": multi_modal_input,', CITED_COMMIT),
    ("areal/experimental/openai/types.py", 224, "original_rewards=torch.tensor([float(original_reward)]),", CITED_COMMIT),
    ("areal/trainer/rl_trainer.py", 761, 'traj["rl_loss_weight"] = self.config.teacher.rl_loss_weight', CITED_COMMIT),
    ("areal/trainer/ppo/actor.py", 239, 'old_logp = torch.roll(data["logprobs"], shifts=-1, dims=-1)', CITED_COMMIT),
    ("areal/trainer/rl_trainer.py", 1379, 'filename = f"step_{step:06d}.pt"', PR_1407),
    ("areal/trainer/rl_trainer.py", 1388, "torch.save(batch, path)", PR_1407),
]  # fmt: skip

# git's blob id of each cited file at cbff54d.
CITED_FILE_BLOBS = {
    "areal/api/cli_args.py": "1de6e3a3032634cfb9b0dbd00892749a6e854d8d",
    "areal/engine/fsdp_engine.py": "390c2c632ab5d95563ba9063745a22bd47925338",
    "areal/experimental/openai/types.py": "3cb7f138a4eb8e9de4c292227ad992ee9c99a4eb",
    "areal/infra/launcher/local.py": "3a76a5ac873571ef742e4c9ad46ef1d7c636b38f",
    "areal/infra/remote_inf_engine.py": "390b13fe0ad27db50385c66b17ea537b25031662",
    "areal/infra/rpc/guard/engine_blueprint.py": "e481e979810e8f1b305a079077224088a974251d",
    "areal/infra/rpc/rtensor.py": "bb3d18e3e326add6630306ba29c9b6900c081626",
    "areal/infra/utils/proc.py": "8ac488927414bb92a199260fe2061fb9fa318796",
    "areal/infra/workflow_executor.py": "514b15dbf3174309c170ead208705419a30c8492",
    "areal/trainer/ppo/actor.py": "35a1439c62b4edaf1d23332096adc63042cdb060",
    "areal/trainer/rl_trainer.py": "bcbc06b81fe1912f402acb59415cf50349388b20",
    "areal/utils/data.py": "1560742a1af28e0aa91c7bf6a368eeb48f356bad",
    "areal/utils/logging.py": "f54a384e1fd34a04c4b117f70ef06a0f129b35dd",
    "areal/utils/printing.py": "284e12eef2f25dd7c60d9a34bc63e6bbbdf4ff5b",
    "areal/utils/stats_logger.py": "220e6d3920da1b197370b37f4ff3df6fd8c9566b",
    "areal/utils/stats_tracker.py": "844036f87458fba5d17e5bdbf3137d454de46cab",
    "areal/workflow/rlvr.py": "b592a0a0a938f4f752ab1e5e234daf12df78e626",
    "areal/workflow/vision_rlvr.py": "63204f6f6c0b7f35218710ace2aeaea2b13a569b",
}

# The cited files that areal 1.0.4 has unchanged (so it answers their citations).
UNCHANGED_IN_RELEASE = {"areal/utils/printing.py", "areal/utils/stats_logger.py"}


def digest(lines: list[str], cite: Cite) -> str:
    block = "\n".join(lines[cite.first - 1 : cite.last])
    return hashlib.sha256(block.encode()).hexdigest()[:16]


def check(source: AReaLSource, cites: list[Cite]) -> list[str]:
    """What is wrong with these citations in this source (empty: all correct)."""
    wrong = []
    files: dict[str, list[str]] = {}
    for cite in cites:
        lines = files.setdefault(cite.path, source.read(cite.path).splitlines())
        where = f"{cite.path}:{cite.first}-{cite.last} in {source.label}"
        if len(lines) < cite.last:
            wrong.append(f"{where}: the file has {len(lines)} lines")
        elif lines[cite.first - 1].strip() != cite.first_line:
            wrong.append(f"{where}: starts with {lines[cite.first - 1].strip()!r}")
        elif digest(lines, cite) != cite.digest:
            wrong.append(f"{where}: the cited lines changed")
    return wrong


def test_every_citation_is_listed_and_uses_the_full_path() -> None:
    found = set()
    for path in CITING_FILES:
        text = path.read_text()
        found |= {(m[1], int(m[2]), int(m[3] or m[2])) for m in CITATION.finditer(text)}
        short = [
            m.group(0)
            for m in ANY_CITATION.finditer(text)
            if not (m.group(1) or "").startswith("areal/")
        ]
        assert short == [], f"{path.name}: cite AReaL as areal/<path>.py:<lines>: {short}"
    listed = {(c.path, c.first, c.last) for c in CITES}
    assert sorted(found - listed) == [], "citations missing from CITES"
    assert sorted(listed - found) == [], "CITES lists citations no file makes"
    assert set(CITED_FILE_BLOBS) == {c.path for c in CITES if c.commit == CITED_COMMIT}


def test_citations_hold_in_the_release_where_the_file_is_unchanged(
    areal_release: ReleaseSource,
) -> None:
    """areal 1.0.4 answers the citations into files it has exactly as cbff54d has them."""
    unchanged = {
        path
        for path, blob in CITED_FILE_BLOBS.items()
        if areal_release.has(path) and git_blob_id(areal_release.read(path)) == blob
    }
    assert unchanged == UNCHANGED_IN_RELEASE, f"files unchanged in areal {AREAL_RELEASE}"
    cites = [c for c in CITES if c.commit == CITED_COMMIT and c.path in unchanged]
    assert len(cites) == 4
    assert check(areal_release, cites) == []


@pytest.mark.parametrize("commit", [CITED_COMMIT, PR_1407], ids=["cbff54d", "pr1407"])
def test_every_citation_holds_at_its_commit(commit: str) -> None:
    source = areal_checkout(commit)
    cites = [c for c in CITES if c.commit == commit]
    assert check(source, cites) == []
    files = {path: source.read(path).splitlines() for path, _, _, c in KEY_LINES if c == commit}
    for path, line, text, c in KEY_LINES:
        if c == commit:
            assert files[path][line - 1].strip() == text, f"{path}:{line}"
    if commit == CITED_COMMIT:
        blobs = {path: git_blob_id(source.read(path)) for path in CITED_FILE_BLOBS}
        assert blobs == CITED_FILE_BLOBS
