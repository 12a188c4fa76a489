"""`python3 -m areal_node.trainer ARGS`: the reference trainer (see the package docstring)."""

import sys

from areal_node.trainer.cli import main

sys.exit(main())
