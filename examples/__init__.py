"""Example implementations and adapters (not part of kvspec)."""
