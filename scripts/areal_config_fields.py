"""Write the config classes and fields of AReaL's `areal/api/cli_args.py` as JSON.

The console suggests AReaL config keys (`rollout.max_head_offpolicyness`, ...); a test
checks every one against this list. Regenerate it from an AReaL checkout when AReaL moves:

    python scripts/areal_config_fields.py AREAL_REPO [COMMIT] > tests/data/areal_cli_args_COMMIT.json

The file is read with `ast` only (never imported): each `@dataclass` class with its bases
and its annotated fields (the annotation as written), plus the commit it came from.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from typing import Any

CLI_ARGS = "areal/api/cli_args.py"


def dataclass_fields(source: str) -> dict[str, dict[str, Any]]:
    """{class: {"bases": [...], "fields": {name: annotation}, "line": n}} of every class."""
    tree = ast.parse(source)
    classes: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = {}
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields[stmt.target.id] = ast.unparse(stmt.annotation)
        classes[node.name] = {
            "line": node.lineno,
            "bases": [ast.unparse(b) for b in node.bases],
            "fields": fields,
        }
    return classes


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print("usage: areal_config_fields.py AREAL_REPO [COMMIT]", file=sys.stderr)
        return 2
    repo, commit = argv[0], argv[1] if len(argv) > 1 else "HEAD"
    try:
        full = subprocess.run(
            ["git", "-C", repo, "rev-parse", commit], check=True, capture_output=True, text=True
        ).stdout.strip()
        source = subprocess.run(
            ["git", "-C", repo, "show", f"{full}:{CLI_ARGS}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: cannot read {CLI_ARGS} at {commit} in {repo}: {exc}", file=sys.stderr)
        return 1
    out = {
        "repository": "areal-project/AReaL",
        "commit": full,
        "file": CLI_ARGS,
        "root": "PPOConfig",
        "classes": dataclass_fields(source),
    }
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
