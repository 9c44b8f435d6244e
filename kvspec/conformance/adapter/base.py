"""The :class:`Adapter` base class: the attributes that declare what an implementation
handles and its contract, and the hooks every adapter may answer. The capabilities are
not here: each is a protocol (:mod:`kvspec.conformance.adapter.protocol`) declared in its
family's folder, which an adapter subclasses beside :class:`Adapter`; :class:`FullAdapter`
is the base that implements them all."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from kvspec.conformance.adapter.contract import Acceptance
from kvspec.conformance.adapter.protocol import AdapterProtocol
from kvspec.conformance.adapter.protocols import PROTOCOLS, EveryProtocol
from kvspec.conformance.domain import FIRST_RELEASE, Domain
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.topology.case import TransferCase
from kvspec.topology.plan import ReplicaRule


class Adapter:
    """Base class of every adapter; by itself it provides no capability.

    An adapter's capabilities are the protocols it implements, found by type: subclass
    :class:`Adapter` and each capability protocol your implementation answers, and
    override every method of each (``class Mine(Adapter, RoutingProtocol,
    LayoutsProtocol)``; the protocols are in :mod:`kvspec.conformance.adapter.protocols`, one
    module per clause family). A check needing a protocol the adapter does not implement
    is reported "not provided". :class:`FullAdapter` implements every protocol.

    Deprecated, kept so adapters written before the protocols still load: a subclass that
    overrides every method of a capability without naming its protocol is registered as
    implementing it (:meth:`__init_subclass__`, with a ``DeprecationWarning`` naming the
    protocols to list); a lone ``validate`` still stands for every ``validate_*``.

    Attributes an adapter may set:

    - ``name``, ``version``: shown in reports.
    - ``domain``: what the implementation handles (:class:`Domain`); every check draws
      its examples inside it. The default is the first release's (TP and PP, dividing
      TP pairs); declare attention DP, context parallelism and non-dividing TP pairs to
      be checked on them.
    - ``policies``: the replica-choice policies [PLAN-4] it implements: the spec's names
      (``lowest``, ``balanced``) or names of ``policy_rules``; generated cases use only
      these, and the policy checks run only if any. :meth:`sources` must refuse (raise) a
      ``case.policy`` it does not implement rather than route under another [PLAN-4.4];
      an adapter naming no policy is routed under ``lowest`` only. The checks' pinned
      cases written under ``lowest`` reach an adapter that does not name it under its
      first policy (:mod:`kvspec.conformance.pins`).
    - ``policy_rules``: policies of its own, name -> rule (a function of a
      :class:`~kvspec.topology.plan.ReplicaChoice` returning the sending TP rank), checked against
      PLAN-2, PLAN-3 and determinism, and routing against the rule [PLAN-4]. The engines'
      rules are in :data:`kvspec.topology.field_policies.FIELD_RULES`. Every family's
      expected values are planned under the declared rule, a hybrid's layer groups,
      windows and state reads included [GROUP-3, STATE-2].
    - ``slicing_modes``: which of ``"sender"``/``"receiver"`` slicing its sender
      transform can do [SLICE-2].
    - ``coalesces``: its descriptor lists claim to be coalesced into maximal runs, so
      they are held to the minimum count [DESC-3].

    The engine's contract — its own legitimate choices, against which a failure is
    judged (what it costs, and whether serving can reach it):

    - ``refusal_types``: the exceptions the implementation refuses an input with. A
      refusal probe passes on any of these; any other exception (``IndexError``,
      ``ZeroDivisionError``) is a crash, tier ``breaks``, never a refusal. A refusal
      whose message names none of the offending values is an ``unclear`` note on the
      check, not a failure.
    - ``replicas_write``: ``"one"`` (kvspec's choice: exactly one replica sends a
      replicated head [PLAN-2]) or ``"every"`` (every replica sends identical bytes and
      the receiver counts them, as SGLang does); under ``"every"`` a second sender of a
      replica's identical bytes is tier ``differs``, not ``corrupts``.
    - ``serving_never_produces``: obligation id -> why serving cannot produce the input
      its refusal probe hands over (request ids the engine generates, ranks taken from
      its process groups, a shipment from a sender its own plan never lists), citing the
      engine's source. A failure on those obligations alone is reported not reachable in
      serving.
    - :meth:`serving_accepts`: runs the engine's own start-up validation on a deployment
      and says whether the engine starts with it.
    """

    name: str = "unnamed"
    version: str = ""
    domain: Domain = FIRST_RELEASE
    policies: tuple[str, ...] = ()
    policy_rules: Mapping[str, ReplicaRule] = MappingProxyType({})
    slicing_modes: tuple[str, ...] = ("sender",)
    coalesces: bool = False
    refusal_types: tuple[type[BaseException], ...] = (ValueError,)
    replicas_write: str = "one"
    serving_never_produces: Mapping[str, str] = MappingProxyType({})

    @property
    def drawn_policies(self) -> tuple[str, ...]:
        """The replica policies the suite routes this adapter's cases under: those it
        names (:attr:`policies`), or ``lowest`` when it names none [PLAN-4]."""
        return tuple(self.policies) or ("lowest",)

    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        """Whether the engine starts with the deployment ``config`` (both stages and the
        model), by its own start-up validation (server-argument checks, config checks,
        stage config), with the evidence; ``None`` when the adapter cannot tell."""
        return None

    def layer_partition(self, num_layers: int, pp: int) -> Sequence[int] | None:
        """The engine's own default split of ``num_layers`` layers over ``pp`` pipeline
        stages (layers per stage, in order), when a deployment names no partition; ``None``
        when its default is kvspec's [LAYER-1]. Generated stages that name no partition
        are given this one explicitly [LAYER-2], and so are the checks' pinned cases
        (:mod:`kvspec.conformance.pins`), so an engine is checked on the split it really
        runs (SGLang's ``get_pp_indices`` puts the extra layers last)."""
        return None

    def supports(self, case: TransferCase) -> bool:
        """Whether ``case`` is inside the implementation's domain, beyond :attr:`domain`.

        The checks already draw inside :attr:`domain`; this is a final filter for what
        the data cannot say. Cases it turns away are counted, not checked, and a check
        left with too few examples is reported inconclusive.
        """
        return True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a subclass that defines every method of a capability protocol it does
        not name as implementing that protocol (deprecated: name the protocols instead)."""
        super().__init_subclass__(**kwargs)
        found = [p for p in PROTOCOLS if not issubclass(cls, p) and _by_methods(cls, p)]
        if found:
            names = ", ".join(p.__name__ for p in found)
            warnings.warn(
                f"{cls.__qualname__} implements {names} by its methods alone; name them "
                f"among its bases (class {cls.__name__}(Adapter, {names}), from "
                "kvspec.conformance.adapter.protocols): finding capabilities by method "
                "alone is deprecated",
                DeprecationWarning,
                stacklevel=3,
            )


class FullAdapter(Adapter, EveryProtocol):
    """An adapter implementing every capability protocol: a subclass overrides every
    method of every protocol (the reference does). The checks see the adapter they run as
    this type; each calls only the protocols its ``needs`` name, which the runner has found
    the adapter implements."""


def _by_methods(cls: type, protocol: type[AdapterProtocol]) -> bool:
    """Whether ``cls`` defines every method of ``protocol`` (or an older name of it); if
    so, it is registered as implementing it, a method given by its older name forwarding
    to it."""
    given: dict[str, str] = {}
    for method in protocol.methods:
        names = [n for n in (method, *protocol.older.get(method, ())) if _defines(cls, n)]
        if not names:
            return False
        given[method] = names[0]
    for method, name in given.items():
        if name != method:
            setattr(cls, method, _forward(name))
    protocol.register(cls)
    return True


def _defines(cls: type, method: str) -> bool:
    """Whether ``cls`` has a callable ``method``."""
    return callable(getattr(cls, method, None))


def _forward(name: str) -> Callable[..., Any]:
    """A method calling the adapter's ``name`` with its arguments (``validate``)."""

    def forwarded(self: Adapter, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, name)(*args, **kwargs)

    forwarded.__name__ = name
    return forwarded
