"""The wire family: the wire format [WIRE].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("WIRE",)
"""The clause families this folder holds the pieces of."""
