"""AReaL's own source, for the tests that run or read it beside our transcriptions.

Two sources, read by path, never installed (AReaL requires torch<2.11, which would replace
the pinned torch, and an installed `areal` would shadow the test stub of its RTensor
module):

- the release: `areal==1.0.4` from the package index, the newest release, downloaded with
  `pip download --no-deps` into a private cache folder (pytest's cache, `.pytest_cache/d/`)
  and unpacked there; its SHA-256 is pinned. Every check 1.0.4 can answer runs on it, so in
  CI too. Tests name it `areal 1.0.4`.
- a checkout at the commit the transcriptions cite (cbff54d, about 120 commits after 1.0.4,
  and PR #1407): the git repository named by `$AREAL_REPO`. Optional; the checks that need
  it skip, saying so, where the variable is not set, and fail where it names a repository
  without the commit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from areal_node.constants import AREAL_COMMIT, AREAL_PR_1407_COMMIT

AREAL_RELEASE = "1.0.4"
AREAL_RELEASE_WHEEL = f"areal-{AREAL_RELEASE}-py3-none-any.whl"
AREAL_RELEASE_SHA256 = "7d7cfab10d9ec0990d9263290a9472366827783b9ad5fce22f56a1add416bdd9"
# The commit the transcriptions cite, and the trajectory dump pull request's.
CITED_COMMIT = AREAL_COMMIT
PR_1407_COMMIT = AREAL_PR_1407_COMMIT
AREAL_REPO_ENV = "AREAL_REPO"  # a git checkout of AReaL with the cited commits


class AReaLSource:
    """Files of one AReaL version, by repository path (e.g. `areal/utils/data.py`)."""

    label: str

    def read(self, path: str) -> str:
        raise NotImplementedError


class ReleaseSource(AReaLSource):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.label = f"areal {AREAL_RELEASE}"

    def read(self, path: str) -> str:
        return (self.root / path).read_text()

    def has(self, path: str) -> bool:
        return (self.root / path).is_file()


class CheckoutSource(AReaLSource):
    def __init__(self, repo: str, commit: str) -> None:
        self.repo = repo
        self.commit = commit
        self.label = f"AReaL {commit[:7]}"

    def read(self, path: str) -> str:
        result = subprocess.run(
            ["git", "-C", self.repo, "show", f"{self.commit}:{path}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"${AREAL_REPO_ENV}={self.repo}: no {path} at {self.commit[:8]}: "
                f"{result.stderr.strip()}"
            )
        return result.stdout


def git_blob_id(text: str) -> str:
    """The id git gives a file with this content (`git hash-object`)."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetch_release(cache: Path) -> Path:
    """`areal==1.0.4` unpacked under `cache` (downloaded once, checked against its hash).

    Raises RuntimeError, with pip's own message, when it cannot be had: the package index is
    part of what CI provides, so that is a failure, not a reason to skip."""
    unpacked = cache / f"areal-{AREAL_RELEASE}"
    if (unpacked / "areal" / "__init__.py").is_file():
        return unpacked
    wheel = cache / AREAL_RELEASE_WHEEL
    if not wheel.is_file():
        # Each process downloads into its own folder and moves the wheel into place, so
        # that parallel test workers never read a half-written file.
        download = Path(tempfile.mkdtemp(prefix=".download-", dir=_mkdir(cache)))
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", str(download), f"areal=={AREAL_RELEASE}"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if result.returncode != 0 or not (download / AREAL_RELEASE_WHEEL).is_file():
            shutil.rmtree(download, ignore_errors=True)
            raise RuntimeError(
                f"pip download areal=={AREAL_RELEASE} failed: {result.stderr.strip()[-1000:]}"
            )
        os.replace(download / AREAL_RELEASE_WHEEL, wheel)
        shutil.rmtree(download, ignore_errors=True)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != AREAL_RELEASE_SHA256:
        wheel.unlink()
        raise RuntimeError(f"{AREAL_RELEASE_WHEEL} has SHA-256 {digest}, not the pinned one")
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=cache))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(staging)
    try:
        staging.rename(unpacked)
    except OSError:  # another worker unpacked it first
        shutil.rmtree(staging, ignore_errors=True)
    return unpacked


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkout(commit: str) -> CheckoutSource | None:
    """The `$AREAL_REPO` checkout at `commit`, or None where the variable is not set."""
    repo = os.environ.get(AREAL_REPO_ENV)
    if not repo:
        return None
    return CheckoutSource(repo, commit)
