"""The models family: the model facts a transfer needs, valid and agreeing between the stages
[MODEL].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("MODEL",)
"""The clause families this folder holds the pieces of."""
