"""The console's stylesheet: one file, loaded by the App (see global.tcss)."""

from pathlib import Path

STYLESHEET = Path(__file__).resolve().parent / "global.tcss"
