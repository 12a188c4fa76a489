"""Where batch data comes from: this machine, or a node whose agent reads the file.

Both sources answer the same four questions (summary, sample table, one sample, the files
of a dump directory) with the same JSON-able dicts, so the CLI and the Batches screen do
not care where the file lives. A node computes everything next to the file: its agent runs
from the payload, which holds the batch reader (`areal_node.batches`); the agent's `load`
op adds the reader's ops once per session, and only small results travel back.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from areal_node import batches
from areal_node.batches import BatchError, UnsafePickleError

from areal_console.core.connection.client import AgentDisconnected, AgentError
from areal_console.core.connection.fleet import NodeSession

EXTENSION_NAME = "batches"
# The batch reader's agent ops, a module of the payload the node's agent runs from.
EXTENSION_MODULE = "areal_node.batches.ops"


class BatchSource(Protocol):
    """Reads batches somewhere; every method may raise `BatchError`."""

    where: str

    def summary(
        self, path: str, *, eos_token_id: int | None = None, trust_pickle: bool = False
    ) -> dict[str, Any]: ...

    def samples(
        self,
        path: str,
        *,
        step: int | None = None,
        dp_rank: int | None = None,
        eos_token_id: int | None = None,
        trust_pickle: bool = False,
    ) -> dict[str, Any]: ...

    def sample(
        self,
        path: str,
        index: int,
        *,
        step: int | None = None,
        dp_rank: int | None = None,
        eos_token_id: int | None = None,
        trust_pickle: bool = False,
    ) -> dict[str, Any]: ...

    def list_dir(self, path: str) -> dict[str, Any]: ...


class LocalBatchSource:
    """Files on this machine, read in this process."""

    where = "local"

    def summary(
        self, path: str, *, eos_token_id: int | None = None, trust_pickle: bool = False
    ) -> dict[str, Any]:
        result: dict[str, Any] = batches.json_safe(
            batches.summarize(path, eos_token_id=eos_token_id, trust_pickle=trust_pickle)
        )
        return result

    def samples(
        self,
        path: str,
        *,
        step: int | None = None,
        dp_rank: int | None = None,
        eos_token_id: int | None = None,
        trust_pickle: bool = False,
    ) -> dict[str, Any]:
        file = batches.resolve_step_file(path, step, dp_rank)
        result: dict[str, Any] = batches.json_safe(
            batches.sample_table(file, eos_token_id=eos_token_id, trust_pickle=trust_pickle)
        )
        return result

    def sample(
        self,
        path: str,
        index: int,
        *,
        step: int | None = None,
        dp_rank: int | None = None,
        eos_token_id: int | None = None,
        trust_pickle: bool = False,
    ) -> dict[str, Any]:
        file = batches.resolve_step_file(path, step, dp_rank)
        result: dict[str, Any] = batches.json_safe(
            batches.sample_view(file, index, eos_token_id=eos_token_id, trust_pickle=trust_pickle)
        )
        return result

    def list_dir(self, path: str) -> dict[str, Any]:
        try:
            files = batches.list_dump_dir(path)
        except OSError as exc:
            raise BatchError(f"{path}: {exc.strerror or exc}") from None
        return {"path": path, "files": [{k: v for k, v in e.items() if k != "path"} for e in files]}


class RemoteBatchSource:
    """Files on a node: the node's agent runs the batch reader next to them."""

    def __init__(self, session: NodeSession, timeout: float = 120.0) -> None:
        self.session = session
        self.timeout = timeout
        self.where = session.name
        self._loaded_client: object | None = None
        self._lock = threading.Lock()

    def _ensure_loaded(self) -> None:
        with self._lock:
            if self.session.client is not None and self._loaded_client is self.session.client:
                return
            self._call("load", {"name": EXTENSION_NAME, "module": EXTENSION_MODULE})
            # A reconnect starts a fresh agent that has to be taught again.
            self._loaded_client = self.session.client

    def _call(self, op: str, args: dict[str, Any]) -> Any:
        try:
            return self.session.call(op, args, timeout=self.timeout)
        except AgentError as exc:
            message = f"{self.session.name}: {exc}"
            if is_unsafe_pickle_error(message):
                raise UnsafePickleError(message) from None
            raise BatchError(message) from None
        except (AgentDisconnected, OSError) as exc:
            raise BatchError(f"{self.session.name}: node unreachable: {exc}") from None

    def _op(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        self._ensure_loaded()
        result: dict[str, Any] = self._call(op, {k: v for k, v in args.items() if v is not None})
        return result

    def summary(
        self, path: str, *, eos_token_id: int | None = None, trust_pickle: bool = False
    ) -> dict[str, Any]:
        return self._op(
            "batch_summary",
            {"path": path, "eos_token_id": eos_token_id, "trust_pickle": trust_pickle},
        )

    def samples(
        self,
        path: str,
        *,
        step: int | None = None,
        dp_rank: int | None = None,
        eos_token_id: int | None = None,
        trust_pickle: bool = False,
    ) -> dict[str, Any]:
        return self._op(
            "batch_samples",
            {
                "path": path,
                "step": step,
                "dp_rank": dp_rank,
                "eos_token_id": eos_token_id,
                "trust_pickle": trust_pickle,
            },
        )

    def sample(
        self,
        path: str,
        index: int,
        *,
        step: int | None = None,
        dp_rank: int | None = None,
        eos_token_id: int | None = None,
        trust_pickle: bool = False,
    ) -> dict[str, Any]:
        return self._op(
            "batch_sample",
            {
                "path": path,
                "index": index,
                "step": step,
                "dp_rank": dp_rank,
                "eos_token_id": eos_token_id,
                "trust_pickle": trust_pickle,
            },
        )

    def list_dir(self, path: str) -> dict[str, Any]:
        return self._op("batch_list", {"path": path})


def is_unsafe_pickle_error(message: str) -> bool:
    """Whether an error (local or relayed by a node) is the refusal to run pickled code."""
    return "could run code when loaded" in message
