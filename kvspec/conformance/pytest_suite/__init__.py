"""The conformance suite as a pytest test module (see :mod:`kvspec.conformance.plugin`)."""
