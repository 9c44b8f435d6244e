"""The paged family: paged caches: a request's blocks gathered and scattered [PAGED].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("PAGED",)
"""The clause families this folder holds the pieces of."""
