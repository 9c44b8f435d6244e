"""The ownership family: who holds what: a stage's ranks and attention groups, the heads and
layers each rank owns, and the tokens each token shard holds [STAGE, HEAD, LAYER, CP].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("STAGE", "HEAD", "LAYER", "CP")
"""The clause families this folder holds the pieces of."""
