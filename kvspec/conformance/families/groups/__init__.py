"""The groups family: hybrid models: layer groups, state groups and their layouts, windows,
local attention and block sizes [GROUP, STATE, WINDOW, LOCAL, BLOCK, SLAYOUT].

Its checks, mutants, vectors and error cases; it imports no other family."""

CLAUSE_FAMILIES: tuple[str, ...] = ("GROUP", "STATE", "WINDOW", "LOCAL", "BLOCK", "SLAYOUT")
"""The clause families this folder holds the pieces of."""
