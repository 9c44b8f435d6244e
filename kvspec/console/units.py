"""Sizes as people read them: bytes in binary units."""

from __future__ import annotations


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 KiB``, ``8.0 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
