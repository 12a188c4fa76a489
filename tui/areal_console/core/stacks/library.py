"""Which frames are library code: decided by the package a file belongs to, never by where
it is installed. AReaL installed from PyPI, or a trainer pip-installed into site-packages,
is the user's code; torch and its dependencies, the standard library and well-known
infrastructure packages are libraries wherever they live."""

from __future__ import annotations

import re
import sys
from functools import lru_cache

# torch and what it brings along (pip's dependency list of torch), plus the CUDA wheels.
TORCH_PACKAGES = frozenset(
    {
        "torch",
        "torchgen",
        "functorch",
        "torchvision",
        "torchaudio",
        "torchdata",
        "triton",
        "numpy",
        "sympy",
        "mpmath",
        "networkx",
        "jinja2",
        "markupsafe",
        "filelock",
        "fsspec",
        "typing_extensions",
        "nvidia",
    }
)

# Infrastructure a training job runs on: model libraries, inference engines, RPC and web
# servers, schedulers, loggers, test runners.
INFRA_PACKAGES = frozenset(
    {
        "transformers",
        "accelerate",
        "peft",
        "trl",
        "deepspeed",
        "megatron",
        "apex",
        "flash_attn",
        "xformers",
        "einops",
        "safetensors",
        "tokenizers",
        "huggingface_hub",
        "datasets",
        "pyarrow",
        "pandas",
        "tensordict",
        "sglang",
        "vllm",
        "ray",
        "flask",
        "werkzeug",
        "uvicorn",
        "fastapi",
        "starlette",
        "requests",
        "urllib3",
        "httpx",
        "httpcore",
        "aiohttp",
        "anyio",
        "uvloop",
        "zmq",
        "grpc",
        "orjson",
        "pydantic",
        "hydra",
        "omegaconf",
        "tqdm",
        "wandb",
        "tensorboardX",
        "swanlab",
        "psutil",
        "etcd3",
        "pytest",
        "_pytest",
        "pluggy",
    }
)

LIBRARY_PACKAGES = TORCH_PACKAGES | INFRA_PACKAGES
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"threading", "asyncio"}

_INSTALL_ROOT = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_STDLIB_DIR = re.compile(r"[/\\]lib(?:64)?[/\\]python\d+(?:\.\d+)?t?[/\\]")


def _top(relative: str) -> str:
    first = re.split(r"[/\\]", relative, maxsplit=1)[0]
    return first[:-3] if first.endswith(".py") else first


@lru_cache(maxsize=65536)
def package_of(path: str) -> str | None:
    """The top-level package (or module) a source file belongs to, when the path says."""
    if not path or path.startswith("<"):
        return None
    found = list(_INSTALL_ROOT.finditer(path))
    if found:
        return _top(path[found[-1].end() :])
    stdlib = _STDLIB_DIR.search(path)
    if stdlib:
        return _top(path[stdlib.end() :])
    if not path.startswith(("/", "\\")) and not re.match(r"^[A-Za-z]:", path):
        return _top(path)  # py-spy's short file name: relative to its sys.path entry
    return None


@lru_cache(maxsize=65536)
def is_library_file(path: str) -> bool:
    """torch and its dependencies, the standard library, known infrastructure: library.
    Everything else, AReaL's own `areal/...` included, is the user's code."""
    if not path or path.startswith("<"):
        return True  # <frozen importlib._bootstrap>, <string>: the interpreter's
    package = package_of(path)
    if package is not None:
        if package in LIBRARY_PACKAGES:
            return True
        in_stdlib_dir = bool(_STDLIB_DIR.search(path)) and not _INSTALL_ROOT.search(path)
        return in_stdlib_dir or (package in STDLIB and not _INSTALL_ROOT.search(path))
    # An absolute path outside any install root (a source checkout, a container image):
    # library only if it runs through a known library package's directory.
    parts = re.split(r"[/\\]", path)
    return any(part in LIBRARY_PACKAGES for part in parts[:-1])
