"""The stdlib-only core every other package stands on: the clause registry
(:mod:`~kvspec.core.clause`, :mod:`~kvspec.core.clauses`), argument checks
(:mod:`~kvspec.core.require`), errors and forms, reading untrusted input, and the names
start-up needs (profiles, tiers, dtypes). It imports nothing outside the standard
library, so starting ``kvspec`` or reading a clause never loads torch, NumPy or
Hypothesis (tests/spec/test_kvspec_layers.py holds it so)."""
