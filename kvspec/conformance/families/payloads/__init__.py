"""The payloads family: payloads: their dict form and their merge [PAYLOAD].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("PAYLOAD",)
"""The clause families this folder holds the pieces of."""
