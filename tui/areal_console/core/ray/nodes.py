"""A Ray cluster's nodes, from Ray's own API.

Through Ray's state API when `ray` is importable (the `[ray]` extra), else through the
dashboard's HTTP API (`/api/v0/nodes`, port 8265 by default) with the standard library.
Ray's token authentication is honoured: the token comes from `RAY_AUTH_TOKEN`, the file
`RAY_AUTH_TOKEN_PATH` names, or `~/.ray/auth_token`, and travels as Ray's own clients send
it (`Authorization: Bearer ...`); a missing or refused token is one line saying which.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.errors import UserError
from areal_console.core.common.guarded_read import read_guarded, trusted_owners

DEFAULT_DASHBOARD_PORT = 8265
RAY_EXTRA = "pip install 'areal-console[ray]'"
# Where `ray start` records the GCS address of the newest cluster on this machine.
CURRENT_CLUSTER_FILE = "/tmp/ray/ray_current_cluster"
LIST_LIMIT = 10_000  # nodes per listing (Ray's own default is 100)
MAX_REPLY_BYTES = 64 * 1024 * 1024  # a dashboard reply read at most this far
LIST_TIMEOUT = 15.0


@dataclass(frozen=True)
class RayNode:
    """One node as Ray reports it."""

    node_id: str
    ip: str
    name: str  # Ray's node name (its IP unless the node was started with another)
    state: str  # "ALIVE" | "DEAD"
    is_head: bool = False
    resources: Mapping[str, float] = field(default_factory=dict)
    state_message: str | None = None

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"

    @property
    def gpus(self) -> int:
        return int(self.resources.get("GPU", 0) or 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "ip": self.ip,
            "name": self.name,
            "state": self.state,
            "is_head": self.is_head,
            "gpus": self.gpus,
            "cpus": self.resources.get("CPU"),
            "resources": dict(self.resources),
            "state_message": self.state_message,
        }


@dataclass(frozen=True)
class RayAddress:
    """Where the cluster answers: its GCS (`host:port`, for `ray`), its Ray Client
    endpoint (`ray://host:port`), and its dashboard (`http://host:port`)."""

    given: str
    gcs: str | None
    client: str | None
    dashboard: str

    @property
    def for_ray(self) -> str:
        """The address `ray.init` and the state API take."""
        return self.client or self.gcs or self.dashboard


def parse_address(text: str | None, environ: Mapping[str, str] | None = None) -> RayAddress:
    """`--ray [ADDRESS]` as Ray itself reads addresses: none or `auto` means `RAY_ADDRESS`,
    else the cluster `ray start` last started here; `ray://` is a Ray Client endpoint,
    `http(s)://` a dashboard, anything else a GCS `host:port`. The dashboard of a GCS or
    client address is on the same host at 8265 unless `RAY_DASHBOARD_ADDRESS` (or
    `RAY_API_SERVER_ADDRESS`, as `ray job` reads it) says otherwise."""
    env = os.environ if environ is None else environ
    given = (text or "").strip()
    if not given or given == "auto":
        given = env.get("RAY_ADDRESS", "").strip() or _current_cluster()
        if not given:
            raise UserError(
                "--ray: no Ray cluster named and none found here (no RAY_ADDRESS, no "
                f"{CURRENT_CLUSTER_FILE}): give --ray ADDRESS (GCS host:port, ray://host:port "
                "or the dashboard's http://host:8265)"
            )
    dashboard_env = (
        env.get("RAY_DASHBOARD_ADDRESS") or env.get("RAY_API_SERVER_ADDRESS") or ""
    ).strip()
    if given.startswith(("http://", "https://")):
        _host_of(given)  # a malformed URL is one line now, not a traceback later
        return RayAddress(given, None, None, given.rstrip("/"))
    if given.startswith("ray://"):
        host = _host_of(given)
        return RayAddress(given, None, given, _dashboard(dashboard_env, host))
    host = _host_of(f"tcp://{given}")
    return RayAddress(given, given, None, _dashboard(dashboard_env, host))


def dashboard_of(address: str) -> str:
    """The dashboard URL of a cluster address as `ray.init` takes it."""
    try:
        return parse_address(address).dashboard
    except UserError:
        return f"http://{address}"


def _current_cluster() -> str:
    """The address in CURRENT_CLUSTER_FILE, when root or this user wrote it. /tmp is
    everyone's: another user's file there named an address that then got the Ray token,
    and a FIFO there hung `--ray` past every timeout."""
    try:
        data = read_guarded(CURRENT_CLUSTER_FILE, 4096, trusted_owners())
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise UserError(
            f"--ray: {CURRENT_CLUSTER_FILE} not read ({exc}): give --ray ADDRESS"
        ) from None
    return data.decode("utf-8", "replace").strip()


def _host_of(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a port that is no number)
    except ValueError as exc:
        raise UserError(f"--ray: {url.removeprefix('tcp://')!r} is no address: {exc}") from None
    if not host:
        raise UserError(f"--ray: {url.removeprefix('tcp://')!r} names no host")
    return host


def _dashboard(from_env: str, host: str) -> str:
    if from_env:
        return from_env if "://" in from_env else f"http://{from_env}"
    bracketed = f"[{host}]" if ":" in host else host
    return f"http://{bracketed}:{DEFAULT_DASHBOARD_PORT}"


def auth_token(environ: Mapping[str, str] | None = None) -> str | None:
    """Ray's authentication token as Ray's own clients find it, or None."""
    env = os.environ if environ is None else environ
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = env.get("RAY_AUTH_TOKEN_PATH") or os.path.join(
        os.path.expanduser("~"), ".ray", "auth_token"
    )
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096).strip() or None
    except OSError:
        return None


def ray_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def list_nodes(
    address: RayAddress, *, use_ray: bool | None = None, timeout: float = LIST_TIMEOUT
) -> tuple[list[RayNode], str]:
    """The cluster's nodes (alive and dead) and how they were read ("state-api" or
    "dashboard"); `UserError` with one line when the cluster can't be asked."""
    token = auth_token()
    if use_ray is None:
        use_ray = ray_importable()
    if use_ray:
        return _list_with_ray(address, token, timeout), "state-api"
    return _list_over_http(address, token, timeout), "dashboard"


def quiet_ray_client() -> None:
    """Ray Client logs each connection on stderr (the driver options it forwards at INFO,
    the server's warnings relayed through its log stream, whose level it sets to INFO
    itself): the console's stderr is for its own notes and one-line errors. A filter, as
    Ray resets these loggers' levels as it connects."""
    for name in ("ray.client_builder", "ray._private.worker", "ray.util.client.logsclient"):
        logger = logging.getLogger(name)
        if _errors_only not in logger.filters:
            logger.addFilter(_errors_only)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def _list_with_ray(address: RayAddress, token: str | None, timeout: float) -> list[RayNode]:
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    if address.client:
        quiet_ray_client()

    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        client = StateApiClient(address.for_ray, headers=headers)
        rows = client.list(
            StateResource.NODES,
            options=ListApiOptions(limit=LIST_LIMIT, timeout=int(max(timeout, 1)), detail=True),
            raise_on_missing_output=False,
        )
    except Exception as exc:  # Ray raises many kinds; each becomes one line
        raise UserError(_ray_failure(address, token, exc)) from None
    return [_node(r if isinstance(r, dict) else vars(r)) for r in rows]


def _ray_failure(address: RayAddress, token: str | None, exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300] or exc.__class__.__name__
    lower = text.lower()
    if "401" in text or "authentication required" in lower or "unauthorized" in lower:
        return _token_missing(address)
    if "403" in text or "authentication failed" in lower or "forbidden" in lower:
        return _token_refused(address, token)
    first = text.split(". ")[0].rstrip(".")  # Ray's reason; the rest is its advice
    return f"--ray: can't reach the Ray cluster at {address.given}: {first}"


def _token_missing(address: RayAddress) -> str:
    return (
        f"--ray: the Ray cluster at {address.given} requires a token: set RAY_AUTH_TOKEN "
        "(or RAY_AUTH_TOKEN_PATH, or put it in ~/.ray/auth_token)"
    )


def _token_refused(address: RayAddress, token: str | None) -> str:
    where = "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else "the token file"
    if token is None:
        return _token_missing(address)
    return f"--ray: the Ray cluster at {address.given} refused the token from {where}"


def _list_over_http(address: RayAddress, token: str | None, timeout: float) -> list[RayNode]:
    url = f"{address.dashboard}/api/v0/nodes?limit={LIST_LIMIT}&detail=1"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            body = reply.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise UserError(_token_missing(address)) from None
        if exc.code == 403:
            raise UserError(_token_refused(address, token)) from None
        raise UserError(
            f"--ray: the Ray dashboard at {address.dashboard} answered HTTP {exc.code}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"--ray: no Ray dashboard at {address.dashboard} ({reason}); without the [ray] "
            f"extra nodes are listed through the dashboard: give its address "
            "(--ray http://HOST:PORT or RAY_DASHBOARD_ADDRESS)"
        ) from None
    if len(body) > MAX_REPLY_BYTES:
        raise UserError(f"--ray: the Ray dashboard's node list is over {MAX_REPLY_BYTES} bytes")
    try:
        rows = json.loads(body)["data"]["result"]["result"]
        if not isinstance(rows, list):
            raise TypeError("result is no list")
        return [_node(r) for r in rows if isinstance(r, dict)]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"--ray: {address.dashboard} is no Ray dashboard (its node list did not parse: {exc})"
        ) from None


def _node(row: Mapping[str, Any]) -> RayNode:
    resources = row.get("resources_total") or {}
    clean = {
        str(k): float(v)
        for k, v in (resources.items() if isinstance(resources, dict) else ())
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    ip = str(row.get("node_ip") or "")
    return RayNode(
        node_id=str(row.get("node_id") or ""),
        ip=ip,
        name=str(row.get("node_name") or ip),
        state=str(row.get("state") or "?"),
        is_head=bool(row.get("is_head_node")),
        resources=clean,
        state_message=(str(row["state_message"]) if row.get("state_message") else None),
    )
