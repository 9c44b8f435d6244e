"""The indexer family: the sparse-attention indexer's cache [INDEX].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("INDEX",)
"""The clause families this folder holds the pieces of."""
