"""A package's names bound on first use, from one of its submodules (PEP 562).

For names a one-shot command never uses: importing the package then does not import the
submodule that defines them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, submodule: str, names: frozenset[str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: each of `names` is imported from
    `package.submodule` when first asked for, then bound in the package."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{submodule}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
