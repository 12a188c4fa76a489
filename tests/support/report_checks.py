"""What every `areal-console report` test plants and checks: secrets shaped as the real
ones, AReaL run from a source checkout at a known commit, the template's headings, the
bundle's files, and that no planted secret is in any part."""

from __future__ import annotations

import secrets
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

TEMPLATE_HEADINGS = [
    "## Checklist", "## Detailed Information", "### Describe the bug", "### Expected behavior",
    "### Full logs", "## To Reproduce", "### Commit ID", "### Environment", "### Script",
]  # fmt: skip


@dataclass(frozen=True)
class Planted:
    """Fresh secrets: a W&B key (40 hex digits), a Hugging Face token, a Ray auth token,
    and a password in a URL."""

    wandb: str = field(default_factory=lambda: secrets.token_hex(20))
    hf: str = field(
        default_factory=lambda: (
            "hf_" + secrets.token_urlsafe(24).replace("-", "a").replace("_", "b")
        )
    )
    ray: str = field(default_factory=lambda: "raytok" + secrets.token_hex(12))
    url_password: str = field(default_factory=lambda: "pw" + secrets.token_hex(8))

    @property
    def values(self) -> tuple[str, ...]:
        return (self.wandb, self.hf, self.ray, self.url_password)

    def env(self) -> dict[str, str]:
        return {
            "WANDB_API_KEY": self.wandb,
            "HF_TOKEN": self.hf,
            "RAY_AUTH_TOKEN": self.ray,
            "AREAL_STUB_WANDB_BASE_URL": f"https://bob:{self.url_password}@wandb.example.com",
        }

    def wandb_login_line(self) -> str:
        """wandb's login line: the key without its name."""
        return f"wandb: Appending key for api.wandb.ai to your netrc file: {self.wandb}\n"


def areal_checkout(stub: Path, dest: Path, version: str = "2.0.0") -> str:
    """The test stub of AReaL as a source checkout (a git work tree with `pyproject.toml`)
    at a random commit on `main`; the commit."""
    shutil.copytree(stub / "areal", dest / "areal")
    (dest / "pyproject.toml").write_text(f'[project]\nname = "areal"\nversion = "{version}"\n')
    commit = secrets.token_hex(20)
    (dest / ".git" / "refs" / "heads").mkdir(parents=True)
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (dest / ".git" / "refs" / "heads" / "main").write_text(commit + "\n")
    return commit


def bundle_files(path: Path) -> dict[str, bytes]:
    """The bundle's files by their name inside its top folder."""
    with tarfile.open(path) as tar:
        out = {}
        for m in tar.getmembers():
            fh = tar.extractfile(m)
            assert fh is not None
            out[m.name.split("/", 1)[1]] = fh.read()
    return out


def assert_no_secret(planted: tuple[str, ...], markdown: str, files: dict[str, bytes]) -> None:
    for secret in planted:
        assert secret not in markdown, secret
        for name, data in files.items():
            assert secret.encode() not in data, (secret, name)


def assert_template(markdown: str) -> None:
    """The template's headings, word for word, in its order."""
    at = [markdown.index(h + "\n") for h in TEMPLATE_HEADINGS]
    assert at == sorted(at)


def section(markdown: str, heading: str) -> str:
    """One section's text, up to the next heading of the template."""
    start = markdown.index(heading + "\n")
    later = [markdown.find(h + "\n", start + 1) for h in TEMPLATE_HEADINGS]
    ends = [i for i in later if i > start]
    return markdown[start : min(ends) if ends else len(markdown)]
