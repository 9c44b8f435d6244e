"""The descriptors family: transfer descriptors: the byte regions a rank registers and the list
that moves a request [DESC].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("DESC",)
"""The clause families this folder holds the pieces of."""
