"""The oracle family: the oracle: the expected KV of every rank, as the reference computes it
[ORACLE].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("ORACLE",)
"""The clause families this folder holds the pieces of."""
