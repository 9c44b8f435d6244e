"""The transfer family: the bytes that move: dtypes kept bit-exact, head slices and their
markers, shipments cut and reassembled [DTYPE, SLICE, RESHARD].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("DTYPE", "SLICE", "RESHARD")
"""The clause families this folder holds the pieces of."""
