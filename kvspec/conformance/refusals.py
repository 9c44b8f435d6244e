"""Probing refusals, shared by the families' refusal checks: a valid configuration of the
adapter's domain (:func:`valid_configs`), changed one fact at a time to step just
outside the spec's domain (a :data:`Variant`: off by one, negative, of another type or
kind), handed to one of the adapter's ``validate_*`` methods (:func:`refusal_check`),
pinned with the family's own ``transfer`` error cases (:func:`pinned`); and a valid
message changed one thing at a time (a :data:`Probe`), each handed to the adapter's
``decode`` (:func:`refuse_all`) [WIRE, PAYLOAD-1].

What counts as a refusal is judged by
:func:`~kvspec.conformance.checks.expectations.expect_refused`: an exception of the
adapter's declared refusal types, naming the offending values: those a variant changed,
those a configuration drawn (or pinned) invalid as a whole has wrong (a check's
``offending``), those a message probe declares.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import strategies as st

from kvspec.conformance.adapter import VALIDATORS, Adapter
from kvspec.conformance.checks import Context, Example, check
from kvspec.conformance.checks.expectations import changed_values, expect_refused
from kvspec.conformance.draws import Setup, case_examples
from kvspec.conformance.transfer_config import handed
from kvspec.error_cases import OPERATIONS, ErrorCase
from kvspec.topology.model import ModelShape
from kvspec.transport.payload import Payload


def mha_model(
    num_layers: int = 4, heads: int = 4, head_dim: int = 8, **extra: Any
) -> dict[str, Any]:
    """An MHA model's facts as data (``extra`` overrides or adds facts)."""
    return {**ModelShape(num_layers, heads, head_dim).to_dict(), **extra}


def config_between(source_tp: int, target_tp: int, model: dict[str, Any], **extra: Any) -> Example:
    """A TP-only configuration from ``source_tp`` to ``target_tp`` of ``model``."""
    return {
        "source": {"tp": source_tp, "pp": 1, "layer_partition": None},
        "target": {"tp": target_tp, "pp": 1, "layer_partition": None},
        "model": model,
        **extra,
    }


def valid_configs(adapter: Adapter) -> st.SearchStrategy[Example]:
    """Valid configurations of the adapter's domain (``policy`` dropped: routing's concern)."""
    return case_examples(adapter).map(lambda e: {k: v for k, v in e.items() if k != "policy"})


def tp_pp_only(config: Example) -> Example:
    """The configuration without attention groups, token shards or a request: both sides
    TP and PP only, so head rules apply to tp itself."""
    plain = {k: v for k, v in config.items() if k not in ("seq_len", "source_dp", "target_dp")}
    for side in ("source", "target"):
        plain[side] = {k: config[side][k] for k in ("tp", "pp", "layer_partition")}
    return plain


Variant = tuple[str, str, Example]
"""(obligation, what was changed, the configuration)."""


def refusal_check(
    clause: str,
    slug: str,
    title: str,
    covers: tuple[str, ...],
    strategy: Callable[[Adapter], st.SearchStrategy[Example]],
    *,
    method: str,
    missing: Callable[[Adapter], str | None] | None = None,
    pins: tuple[Example, ...] = (),
    variants: Callable[[Adapter, Example], list[Variant]] | None = None,
    offending: Callable[[Example], tuple[object, ...]] | None = None,
) -> None:
    """A check that ``method`` refuses each configuration, or (with ``variants``) every
    variant of each valid configuration, each one step outside the spec's domain. A
    variant's refusal must name what it changed; a configuration drawn or pinned invalid
    as a whole, the values ``offending`` finds wrong in it (a head split's H and tp),
    where the clause asks for them. The check counts as declared where this is called
    (its family's module), not here."""
    declared_in = sys._getframe(1).f_globals["__name__"]

    @check(
        clause,
        slug,
        title,
        needs=(VALIDATORS[method],),
        strategy=strategy,
        examples=pins,
        missing=missing,
        covers=covers,
    )
    def run(ctx: Context, config: Example) -> None:
        # a pinned error case is outside the domain already: probed as it is, not varied
        varied = variants is not None and spec_accepts(config)
        probes = (
            variants(ctx.adapter, config)
            if variants is not None and varied
            else [(covers[0], title, config)]
        )
        for obligation, what, probe in probes:
            handed(probe)

            def validate(probe: Example = probe) -> object:
                return getattr(ctx.adapter, method)(copy.deepcopy(probe))

            if varied:
                naming = changed_values(config, probe)
            else:  # drawn or pinned invalid: what the check finds wrong, if it says
                naming = offending(probe) if offending is not None else ()
            expect_refused(
                obligation,
                f"configuration {probe} ({what})",
                validate,
                naming=naming,
                accepted=probe,
            )

    run.__module__ = declared_in


def spec_accepts(config: Example) -> bool:
    """Whether the spec accepts ``config`` as a transfer (a valid base to make variants
    of), rather than refusing it (a pinned error case)."""
    try:
        OPERATIONS["transfer"](config)
    except ValueError:
        return False
    return True


def needs_axis(attribute: str, what: str) -> Callable[[Adapter], str | None]:
    """A check's ``missing``: ``what`` unless the domain's ``attribute`` sizes go above 1."""

    def why(adapter: Adapter) -> str | None:
        return None if max(getattr(adapter.domain, attribute)) > 1 else what

    return why


def pinned(cases: Iterable[ErrorCase], clause: str) -> tuple[Example, ...]:
    """The configurations of the ``transfer`` error cases of ``clause``: a refusal
    check's pinned examples."""
    return tuple(c.args for c in cases if c.op == "transfer" and c.clause == clause)


Probe = tuple[str, str, list[bytes]] | tuple[str, str, list[bytes], tuple[object, ...]]
"""A message one change away from a valid one: (obligation, what was changed, the frames)
and, where the clause asks a refusal to name them, the offending values (a format, a
key, a length, a layer) [WIRE-4]; without them the exception's type alone decides."""


def refuse_all(ctx: Context, setup: Setup, probes: list[Probe]) -> None:
    """Expect the adapter's ``decode`` to refuse every probe's frames, naming the values a
    probe declares [WIRE, PAYLOAD-1]."""
    for probe in probes:
        obligation, what, frames = probe[:3]
        naming = probe[3] if len(probe) > 3 else ()

        def decode(frames: list[bytes] = frames) -> Payload:
            return ctx.adapter.decode(frames)

        expect_refused(
            obligation, f"{setup.case.describe()}: a message with {what}", decode, naming=naming
        )
