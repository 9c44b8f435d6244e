"""Naming: connector keys and ports, and the domains on which they are injective
[KEY, PORT]."""
