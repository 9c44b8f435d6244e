"""The chunks family: chunked transfers [CHUNK].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("CHUNK",)
"""The clause families this folder holds the pieces of."""
