"""The trainer's command line: options, config keys, and the torchrun relaunch with --nproc."""

from __future__ import annotations

import json
import os
import sys

import areal_node.trainer
from areal_node import launcher
from areal_node.trainer.config import (
    DEFAULTS,
    ConfigError,
    check_replay_input,
    flatten,
    load_config,
)
from areal_node.trainer.lifeline import die_with_parent, wanted
from areal_node.trainer.run import output_dir, run


def relaunch_with_torchrun(nproc: int, argv: list[str], log_dir: str) -> int:
    """Run the trainer under torchrun with `nproc` ranks on this node. The ranks import it
    from where this process did: the package's directory, or the payload zip. torchrun's
    own files go to `log_dir` (by default it leaves a `torchelastic_*` folder in /tmp for
    every run, which nothing removes)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(areal_node.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # torchrun and each rank through the launcher (the working directory off sys.path
    # before torch is imported); `--no-python`: torchrun runs the rank's argv as given.
    rank = launcher.user_module(sys.executable, areal_node.trainer.__name__, *argv, flags=["-u"])
    options = ["--standalone", f"--nproc_per_node={nproc}", f"--log-dir={log_dir}", "--no-python"]
    cmd = launcher.user_module(sys.executable, "torch.distributed.run", *options, *rank)
    return subprocess.call(
        cmd, env=launcher.clean_env(env), preexec_fn=die_with_parent if wanted() else None
    )


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # the console's demo job (and its ranks): not past the console
    args = list(sys.argv[1:] if argv is None else argv)
    nproc, config_file, overrides = 1, None, []
    default_output_dir = "reference-trainer-out"  # when output_dir is not set
    passed_on: list[str] = []  # everything but --nproc, for the torchrun relaunch
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            print(areal_node.trainer.__doc__)
            print("config keys and defaults:")
            for key, value in flatten(DEFAULTS).items():
                print(f"  {key}={json.dumps(value)}")
            return 0
        if arg in ("--nproc", "--config", "--default-output-dir") and i + 1 < len(args):
            if arg == "--default-output-dir":
                default_output_dir = args[i + 1]
                passed_on += args[i : i + 2]
            elif arg == "--nproc":
                try:
                    nproc = int(args[i + 1])
                except ValueError:
                    nproc = 0
                if nproc < 1:
                    print(f"error: --nproc needs a whole number >= 1, got {args[i + 1]!r}",
                          file=sys.stderr)  # fmt: skip
                    return 2
            else:
                config_file = args[i + 1]
                passed_on += args[i : i + 2]
            i += 2
            continue
        if arg.startswith("-"):
            print(f"error: unknown option {arg}", file=sys.stderr)
            return 2
        overrides.append(arg)
        passed_on.append(arg)
        i += 1
    under_torchrun = "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:  # a bad key, value or config file: a usage error
        config = load_config(config_file, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # the dump to replay does not fit: an error in the data
        world = int(os.environ["WORLD_SIZE"]) if under_torchrun else nproc
        td = config["trajectory_debug"]
        if td["replay_rollout_data"]:
            check_replay_input(str(td["path"]), config["start_step"], config["steps"] - 1, world)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if nproc > 1 and not under_torchrun:
        log_dir = os.path.join(output_dir(config, default_output_dir), "torchrun")
        return relaunch_with_torchrun(nproc, passed_on, log_dir)
    run(config, default_output_dir)
    return 0
