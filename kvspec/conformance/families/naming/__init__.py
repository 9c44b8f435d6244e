"""The naming family: keys and ports: how a shipment and a rank are named [KEY, PORT].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("KEY", "PORT")
"""The clause families this folder holds the pieces of."""
