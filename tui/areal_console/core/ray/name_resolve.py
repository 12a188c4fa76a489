"""AReaL's name-resolve records in Ray: the KV actor backend, for `--areal` with `--ray`.

AReaL's `RayNameResolveRepository` keeps every name in one detached actor,
`distributed_kv_store` in the Ray namespace `areal_name_resolve` (areal/utils/name_resolve.py
:29, :885-925 at AReaL cbff54d6), a `DistributedKVStore` (:781-882) whose `get_prefix`
returns `(key, value)` pairs under a normalised prefix (:812-826) and `get_all_keys` every
key (:878-881). The keys are the names the nfs and etcd3 backends use
(`{user}/{experiment}/{trial}/workers/{role}/{index}`), so the records read the same.
Like etcd, the actor has no per-key owner: whoever may call actors on the cluster is
trusted, as AReaL trusts them.
"""

from __future__ import annotations

from typing import Any

from areal_console.core.common.errors import UserError
from areal_console.core.targets.name_resolve import (
    MAX_ENTRIES,
    JobName,
    JobRecords,
    records_from_pairs,
)

KV_ACTOR = "distributed_kv_store"
KV_NAMESPACE = "areal_name_resolve"
KV_TIMEOUT = 10.0


class RayKvRegistry:
    """Records in AReaL's Ray KV actor on the cluster at `address`."""

    def __init__(self, address: str, timeout: float = KV_TIMEOUT) -> None:
        from areal_console.core.ray.channel import connect_ray

        ray = connect_ray(address)
        self._ray = ray
        self.timeout = timeout
        self.source = f"ray:{address}"
        try:
            self._actor = ray.get_actor(KV_ACTOR, namespace=KV_NAMESPACE)
        except ValueError:
            raise UserError(
                f"no AReaL name-resolve actor on the Ray cluster at {address} (no actor "
                f"{KV_ACTOR!r} in namespace {KV_NAMESPACE!r}: the job uses another "
                "name_resolve.type, or has not started)"
            ) from None

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return self._ray.get(getattr(self._actor, method).remote(*args), timeout=self.timeout)
        except Exception as exc:  # the actor gone, the call timed out: one line
            name = exc.__class__.__name__
            raise UserError(f"AReaL's Ray name-resolve actor did not answer ({name})") from None

    def _pairs(self, prefix: str) -> list[tuple[str, str]]:
        pairs = self._call("get_prefix", prefix)
        if not isinstance(pairs, list):
            return []
        return [
            (k, v)
            for k, v in (
                p for p in pairs[:MAX_ENTRIES] if isinstance(p, tuple | list) and len(p) == 2
            )
            if isinstance(k, str) and isinstance(v, str)
        ]

    def _keys(self) -> list[str]:
        keys = self._call("get_all_keys")
        return (
            [k for k in keys[:MAX_ENTRIES] if isinstance(k, str)] if isinstance(keys, list) else []
        )

    def job(self, name: JobName) -> JobRecords:
        return records_from_pairs(name, self.source, self._pairs(name.key))

    def trials(self, user: str) -> list[str]:
        return sorted(
            {
                "/".join(parts[1:3])
                for key in self._keys()
                if len(parts := key.split("/")) > 3 and parts[0] == user
            }
        )

    def users_with(self, experiment: str, trial: str) -> list[str]:
        return sorted(
            {
                parts[0]
                for key in self._keys()
                if len(parts := key.split("/")) > 3 and parts[1:3] == [experiment, trial]
            }
        )
