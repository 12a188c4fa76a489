"""Re-record tests/data/pyspy/saved_worker_server.json: `areal-console stacks --json` of a
real hung 4-rank gloo job (tests/jobs/fr_ranks.py `op`) run by `nobody`, ranks 0-1 with the
launch hook and ranks 2-3 with torch's debug server, taken by a console running as root
without CAP_SYS_PTRACE (every stack from the ranks' worker servers). Needs root, setpriv,
unshare and capsh:

    PYTHONPATH=tui:agents:. python scripts/record_worker_server_fixture.py

Machine paths are rewritten to the neutral root (tests/support/fixtures/neutral_paths.py),
the node is `node0` and rank N's pid 4000+N (no host name or pid of the recording machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.fixtures.fr_jobs import FrJob
from tests.support.fixtures.neutral_paths import neutral

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "pyspy" / "saved_worker_server.json"
DEBUG_SERVER = {"AREAL_FR": "0", "FR_DEBUG_SERVER": "1"}


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="areal-noptrace-", dir="/tmp"))
    workdir.chmod(0o1777)
    job = FrJob("op", workdir, user="nobody", rank_env={2: DEBUG_SERVER, 3: DEBUG_SERVER})
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tui'}{os.pathsep}{ROOT / 'agents'}"}
    try:
        job.wait_ready()
        argv = [sys.executable, "-m", "areal_console", "stacks", "--local", "--match",
                str(workdir), "--json"]  # fmt: skip
        done = subprocess.run(["capsh", "--drop=cap_sys_ptrace", "--", "-c", 'exec "$@"', "sh",
                               *argv], capture_output=True, text=True, env=env, check=True)  # fmt: skip
    finally:
        job.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    doc = json.loads(done.stdout)
    assert {r["source"] for r in doc["ranks"]} == {"worker_server"}, doc["ranks"]
    doc.pop("user", None)
    text = json.dumps(neutral(doc), indent=1)
    for r in doc["ranks"]:
        pid, node = r["pid"], r["node"]
        text = text.replace(f'"pid": {pid},', f'"pid": {4000 + r["rank"]},')
        text = text.replace(f"areal-fr-{pid}.sock", f"areal-fr-{4000 + r['rank']}.sock")
        text = text.replace(f'"node": "{node}"', '"node": "node0"')
        text = text.replace(f" {pid} ", f" {4000 + r['rank']} ")
    OUT.write_text(text + "\n")


if __name__ == "__main__":
    main()
