"""The directory to put on a job's `PYTHONPATH` to reach its Flight Recorder live
(see `sitecustomize.py` here and docs/guide/ledger.md)."""

from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
