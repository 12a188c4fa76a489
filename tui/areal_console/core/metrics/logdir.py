"""Finding an AReaL job's log directory from its processes' command lines.

Pure and cheap to import: a stacks capture reads the job's logs through it, and must not
load the metric analysis (numpy) to do so.
"""

from __future__ import annotations

FLAGS = {
    "--fileroot": "fileroot",
    "--experiment-name": "experiment",
    "--trial-name": "trial",
}
OVERRIDES = {
    "cluster.fileroot": "fileroot",
    "stats_logger.fileroot": "fileroot",
    "experiment_name": "experiment",
    "trial_name": "trial",
    "stats_logger.tensorboard.path": "tensorboard",
}


def run_identity(cmdline: str | list[str]) -> dict[str, str]:
    """fileroot / experiment / trial (and the tensorboard path) from one command line.

    Single-controller workers carry `--fileroot F --experiment-name E --trial-name T`
    (areal/infra/rpc/guard/app.py:518-528 at cbff54d6); a controller or SPMD trainer carries AReaL's
    config overrides `cluster.fileroot=F experiment_name=E trial_name=T`.
    """
    argv = cmdline.split() if isinstance(cmdline, str) else list(cmdline)
    out: dict[str, str] = {}
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in FLAGS:
            if eq:
                out[FLAGS[flag]] = value
            elif i + 1 < len(argv):
                out[FLAGS[flag]] = argv[i + 1]
        elif eq and flag.lstrip("+") in OVERRIDES:
            out[OVERRIDES[flag.lstrip("+")]] = value
    return out


# AReaL's default `cluster.fileroot` (areal/api/cli_args.py:3048-3049 at cbff54d6), for a
# run whose command line names its experiment and trial but not its fileroot.
DEFAULT_FILEROOT = "/tmp/areal"


def safe_component(name: str | None) -> bool:
    """A name that stays one path component: not empty, no `/`, not `.` or `..`, no NUL.
    Another user's process may carry any `--experiment-name`; `../../x` must not steer
    the console into another directory."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")  # type: ignore[operator]


def safe_root(path: str) -> bool:
    """An absolute fileroot with no `..` component and no NUL."""
    return path.startswith("/") and "\0" not in path and ".." not in path.split("/")


def log_dir_of(identity: dict[str, str], user: str) -> str | None:
    """AReaL's log directory: <fileroot>/logs/<user>/<experiment>/<trial> (stats_logger.py:179).

    None when a name would leave its place in that tree (see `safe_component`)."""
    experiment, trial = identity.get("experiment"), identity.get("trial")
    if not (experiment and trial):
        return None
    root = (identity.get("fileroot") or DEFAULT_FILEROOT).rstrip("/") or "/"
    if not (safe_component(experiment) and safe_component(trial) and safe_component(user)):
        return None
    if not safe_root(root):
        return None
    return f"{root.rstrip('/')}/logs/{user}/{experiment}/{trial}"


def log_dir_from_processes(cmdlines: list[str], user: str) -> str | None:
    """The first complete identity among a job's processes, as a log directory."""
    merged: dict[str, str] = {}
    for cmd in cmdlines:
        identity = run_identity(cmd)
        if all(identity.get(k) for k in ("fileroot", "experiment", "trial")):
            return log_dir_of(identity, user)
        for k, v in identity.items():
            merged.setdefault(k, v)
    return log_dir_of(merged, user)
