"""The mutant corpus: the reference implementation with one realistic bug each.

Each mutant is an adapter — the reference, with one method written the way a field
engineer gets a rule wrong: right on the common case, wrong on some configurations
(replicated heads, pipeline stages, a partial block, fp8, a receiver-applied marker,
...). It is registered with the obligation(s) it breaks; the checks that cover those
obligations must kill it under the ``ci`` profile, and ``kvspec conform --mutants``
runs the whole corpus through the whole suite and reports the kill rate.

Mutants are written from the rule text, not from the checks: a mutant nobody kills is
a missing check, never a reason to drop the mutant.

A mutant registered ``unclear`` has a bug in a refusal's message only: it refuses what
it must, with the right exception type, but names none of the offending values its
clause asks for ("invalid head split"). No verdict fails for that (a refusal is judged by
its type; the message is an ``unclear`` quality note, issue 43), so such a mutant is
killed by the first check of the run that carries an ``unclear`` note
(:mod:`kvspec.conformance.mutation`): the suite saw the message and said so.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from kvspec.conformance.adapter import Adapter


@dataclass(frozen=True)
class Mutant:
    """One registered mutant: its adapter class and the obligations it breaks."""

    cls: type[Adapter]
    obligations: tuple[str, ...]
    unclear: bool = False
    """Its bug is a refusal's message that names none of the offending values: an
    ``unclear`` note kills it."""

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def spec(self) -> str:
        """``MODULE:ATTR``, as ``kvspec conform`` loads it."""
        return f"{self.cls.__module__}:{self.cls.__name__}"

    @property
    def bug(self) -> str:
        """The first line of its docstring: what it gets wrong."""
        return (self.cls.__doc__ or "").strip().splitlines()[0]


_REGISTRY: dict[str, Mutant] = {}


def mutant(*obligations: str, unclear: bool = False) -> Callable[[type[Adapter]], type[Adapter]]:
    """Register the decorated adapter class as a mutant breaking ``obligations`` (with
    ``unclear``: by refusing with a message that names none of the offending values)."""

    def register(cls: type[Adapter]) -> type[Adapter]:
        if not obligations:
            raise ValueError(f"mutant {cls.__name__} must name the obligations it breaks")
        if not (cls.__doc__ or "").strip():
            raise ValueError(f"mutant {cls.__name__} needs a docstring saying what it gets wrong")
        if cls.__name__ in _REGISTRY:
            raise RuntimeError(f"mutant {cls.__name__} is registered twice")
        cls.name = f"mutant:{cls.__name__}"
        _REGISTRY[cls.__name__] = Mutant(cls, tuple(obligations), unclear)
        return cls

    return register


def all_mutants() -> list[Mutant]:
    """Every registered mutant, in the order of the first obligation each breaks."""
    from kvspec.conformance.families import modules
    from kvspec.core.clauses import all_obligations

    for name in modules("mutants"):
        importlib.import_module(name)
    order = {oid: i for i, oid in enumerate(all_obligations())}
    unknown = sorted(
        f"{m.name}: {o}" for m in _REGISTRY.values() for o in m.obligations if o not in order
    )
    if unknown:
        raise RuntimeError(f"mutants name obligations that do not exist: {unknown}")
    return sorted(_REGISTRY.values(), key=lambda m: (order[m.obligations[0]], m.name))


def get_mutant(name: str) -> Mutant:
    """The mutant called ``name``; unknown names are refused."""
    mutants = {m.name: m for m in all_mutants()}
    if name not in mutants:
        raise KeyError(f"no mutant {name!r}; see `kvspec clauses --coverage`")
    return mutants[name]
