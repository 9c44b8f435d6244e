"""The checkout's root, for tests that read its files (README, docs, notebooks, examples)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
