"""Adapters for engines in the field, each importing the engine's installed package.

``kvspec conform vllm-omni | vllm-nixl | sglang | vllm-mooncake | vllm-moriio |
vllm-canonical | vllm-layouts`` (built-in names in
:data:`kvspec.conformance.adapter.BUILTIN`). Importing these modules needs no engine:
an adapter imports its engine when it is created, and a missing package is refused with
what to install (``make field`` installs the pinned versions into ``.venv-field``).

Each module keeps its translation between kvspec's objects and the engine's in pure
functions (tested without any engine in tests/suite/test_field_adapters.py), separate from the
:class:`~kvspec.conformance.adapter.Adapter` wiring. Nothing in them restates an engine's
rule: every mapping decision is the engine's own function, called. field/NOTES.md says
what each engine's mapping code needs on a CPU and what could not be reached.
"""
