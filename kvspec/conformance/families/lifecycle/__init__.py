"""The lifecycle family: a request's lifecycle: the state machine and its traces [LIFE].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("LIFE",)
"""The clause families this folder holds the pieces of."""
