"""How to turn the Flight Recorder on for a job, as text to paste: the launch hook on
`PYTHONPATH` for torchrun jobs, and the AReaL config block for its single-controller
workers (rpc_server processes, which the hook turns itself on in).

AReaL facts (areal-project/AReaL cbff54d): a role's workers get the first
`scheduling_spec` entry's `env_vars` (`areal/api/cli_args.py:1178-1181`; the actor's
`scheduling_spec` default, `python -m areal.infra.rpc.rpc_server`, at 1398-1402). The
local scheduler builds each worker's `PYTHONPATH` from the controller's `sys.path` and
then applies `env_vars` over it (`areal/infra/utils/launcher.py:133-166`,
`areal/infra/scheduler/local.py:740-758`): a `PYTHONPATH` in `env_vars` replaces that
path, and the values are joined as `k=v,...` and split again, so a value must hold no
`,` or `=`.
"""

from __future__ import annotations

BUFFER_SIZE = 2000  # entries per rank (the hook's default)


def recorder_setup(hook_dir: str) -> str:
    """The ready-to-paste block: the shell line, then the AReaL YAML for the actor."""
    return "\n".join(
        [
            "# 1. Any job (torchrun, AReaL's controller): start it with the hook on PYTHONPATH.",
            "#    AReaL passes the controller's sys.path on to every worker it starts.",
            f"export PYTHONPATH={hook_dir}${{PYTHONPATH:+:$PYTHONPATH}}",
            "",
            "# 2. Or in the AReaL experiment config (the actor's rpc_server workers). A",
            "#    PYTHONPATH here replaces the one AReaL builds: append the directories",
            "#    your job imports from (no ',' or '=' in a value).",
            "actor:",
            "  scheduling_spec:",
            "    - cmd: python -m areal.infra.rpc.rpc_server",
            "      env_vars:",
            f"        PYTHONPATH: {hook_dir}",
            f'        TORCH_FR_BUFFER_SIZE: "{BUFFER_SIZE}"',
        ]
    )
