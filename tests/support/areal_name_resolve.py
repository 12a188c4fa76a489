"""AReaL's name-resolve writes, transcribed for tests (AReaL cbff54d6).

AReaL's own module (areal/utils/name_resolve.py) imports ray and the etcd3 client at the
top, so it cannot be loaded here; these functions do exactly what its writers do:

- `nfs_add`: NfsNameRecordRepository.add (name_resolve.py:301-328): normalise the name,
  `makedirs` its directory, write the value to `ENTRY.tmp.<uuid[:8]>`, rename to `ENTRY`.
- `etcd_put`: Etcd3NameRecordRepository.add without a lease (name_resolve.py:511-534): the
  normalised name as the key, `str(value)` utf-8 encoded; sent through etcd's v3 gateway.
- `worker_key`: names.worker_discovery (names.py:33-34), `{user}/{exp}/{trial}/workers/
  {role}/{index}`, the key every rpc_server registers with `host:port`
  (areal/infra/rpc/guard/app.py:618-625).
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
import uuid


def worker_key(user: str, experiment: str, trial: str, role: str, index: int) -> str:
    return f"{user}/{experiment}/{trial}/workers/{role}/{index}"


def gen_server_key(user: str, experiment: str, trial: str) -> str:
    """names.gen_servers + add_subentry's `uuid4()[:8]` (names.py:25-26, name_resolve.py:82-90)."""
    return os.path.join(f"{user}/{experiment}/{trial}/gen_servers", str(uuid.uuid4())[:8])


def nfs_add(record_root: str, name: str, value: str) -> str:
    """Write one record as NfsNameRecordRepository.add(replace=True) does; its ENTRY path."""
    name = os.path.normpath(name)
    path = os.path.join(record_root, name, "ENTRY")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    local_id = str(uuid.uuid4())[:8]
    with open(path + f".tmp.{local_id}", "w") as f:
        f.write(str(value))
    os.rename(path + f".tmp.{local_id}", path)
    return path


def etcd_put(address: str, name: str, value: str) -> None:
    """Put one record as Etcd3NameRecordRepository.add (no keepalive_ttl) does."""
    body = {
        "key": base64.b64encode(os.path.normpath(name).encode()).decode(),
        "value": base64.b64encode(str(value).encode("utf-8")).decode(),
    }
    request = urllib.request.Request(
        f"http://{address}/v3/kv/put",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
