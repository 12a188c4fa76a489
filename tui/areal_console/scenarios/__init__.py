"""Real `torch.distributed` (gloo, CPU) programs that hang the way training jobs hang.

Used by the tests, the benchmarks and `areal-console demo`. See `hang.py`.
"""

from areal_console.scenarios.hang import PATTERNS, ScenarioJob, start_scenario

__all__ = ["PATTERNS", "ScenarioJob", "start_scenario"]
