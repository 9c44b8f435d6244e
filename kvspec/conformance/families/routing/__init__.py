"""The routing family: the transfer plan: which source rank sends which heads, layers and
tokens to which target rank, and the router's DP ranks [PLAN, DP].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("PLAN", "DP")
"""The clause families this folder holds the pieces of."""
