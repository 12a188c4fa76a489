"""areal-console: a keyboard-driven terminal console for debugging distributed RL training."""

__version__ = "0.1.0"
