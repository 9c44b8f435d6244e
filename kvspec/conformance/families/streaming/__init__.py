"""The streaming family: streaming a request layer by layer [STREAM].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("STREAM",)
"""The clause families this folder holds the pieces of."""
