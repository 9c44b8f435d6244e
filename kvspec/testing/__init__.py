"""The only Hypothesis users of the spec: the strategies that draw valid inputs
(:mod:`~kvspec.testing.strategies`) and the named profiles (:mod:`~kvspec.testing.profiles`)."""
