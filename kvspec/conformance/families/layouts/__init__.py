"""The layouts family: cache layouts: the presets, records, scaled caches and their conversions
[LAYOUT].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("LAYOUT",)
"""The clause families this folder holds the pieces of."""
