"""Adapters: how an implementation under test is plugged into the conformance suite.

Subclass :class:`Adapter` and override the methods your implementation can answer.
Each group of methods is a *capability*; a check needing a capability you did not
provide is reported "not provided" — never failed, never counted as passed.

Inputs are kvspec's own frozen dataclasses (:class:`~kvspec.stage.StageLayout`,
:class:`~kvspec.model.ModelShape`, :class:`~kvspec.strategies.TransferCase`) and
tensors (:class:`~kvspec.kv.RequestKV`, ``data`` ``[layers, kv, seq, heads, head_dim]``);
an adapter translates them into its implementation's terms and back.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvspec.kv import RequestKV
from kvspec.model import ModelShape
from kvspec.plan import POLICIES
from kvspec.reshard import SLICING_MODES, Shipment
from kvspec.stage import StageLayout
from kvspec.strategies import TransferCase


class NotProvided(Exception):
    """Raised by a capability the adapter does not implement."""


CAPABILITIES: dict[str, tuple[str, ...]] = {
    "ownership": ("owned",),
    "routing": ("sources", "targets"),
    "sender": ("sender_transform",),
    "receiver": ("receiver_combine",),
    "rejection": ("validate",),
    "layouts": ("read_layer",),
    "conversion": ("convert_layout",),
    "detection": ("detect_layout",),
    "paged": ("gather", "scatter"),
    "oracle": ("oracle_fill",),
    "keys": ("rank_aware_key", "legacy_key"),
    "edge-keys": ("send_keys", "recv_keys"),
    "ports": ("kv_port",),
    "payload": ("merge",),
    "chunks": ("reassemble",),
    "wire": ("encode", "decode"),
}
"""Capability name -> the adapter methods it consists of."""


class Adapter:
    """Base class of every adapter; the defaults provide nothing.

    Attributes an adapter may set:

    - ``name``, ``version``: shown in reports.
    - ``policies``: the replica-choice policies [PLAN-4] it implements by the spec's
      names; generated cases use only these, and the policy check runs only if any.
    - ``slicing_modes``: which of ``"sender"``/``"receiver"`` slicing its sender
      transform can do [SLICE-2].
    """

    name: str = "unnamed"
    version: str = ""
    policies: tuple[str, ...] = ()
    slicing_modes: tuple[str, ...] = ("sender",)

    def supports(self, case: TransferCase) -> bool:
        """Whether ``case`` is inside the implementation's declared domain.

        Cases outside it are counted and reported, not checked. Declare a narrower
        domain only for configurations the implementation refuses on purpose.
        """
        return True

    # ownership ------------------------------------------------------------------
    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        """(heads, layers) stage-local ``rank`` holds [STAGE-1, HEAD-1..3, LAYER-1..2]."""
        raise NotProvided

    # routing --------------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        """Source ranks receiver ``dst`` takes KV from [PLAN-2, PLAN-3]."""
        raise NotProvided

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        """Target ranks sender ``src`` sends KV to [PLAN-3]."""
        raise NotProvided

    # sender transform -----------------------------------------------------------
    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        """What sender ``src`` puts on each of its edges, by target rank [SLICE-1].

        ``shard`` is the sender's own shard [RESHARD-1]; ``slicing`` is one of
        :attr:`slicing_modes`.
        """
        raise NotProvided

    # receiver combine -----------------------------------------------------------
    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        """Receiver ``dst``'s shard from the shipments it got, in arrival order [RESHARD-3].

        Each shipment carries its sender (``shipment.edge.src``), its ``tp_head_slice``
        marker and its KV. Refuse (raise) what cannot be combined.
        """
        raise NotProvided

    # rejection ------------------------------------------------------------------
    def validate(self, config: dict[str, Any]) -> None:
        """Raise if the implementation refuses this transfer configuration.

        ``config`` is plain data: ``source`` and ``target`` (``tp``, ``pp``,
        ``layer_partition``), ``model`` (ModelShape fields), optionally
        ``target_model`` (the receiver's model facts) and ``rank``
        (``{"side": "source" | "target", "rank": int}``).
        """
        raise NotProvided

    # cache layouts ---------------------------------------------------------------
    def read_layer(self, cache: Any, layout: str) -> tuple[Any, ...]:
        """K and V (or the latent) of one layer's cache in the named ``layout``, each
        ``[num_blocks, block_size, heads, head_dim]`` and a view of the cache [LAYOUT-1, 2]."""
        raise NotProvided

    def convert_layout(self, cache: Any, source: str, target: str) -> Any:
        """A new cache in ``target`` holding ``cache``'s slots bit for bit [LAYOUT-3]."""
        raise NotProvided

    def detect_layout(
        self,
        cache: Any,
        *,
        heads: int | None = None,
        head_dim: int | None = None,
        block_size: int | None = None,
    ) -> str:
        """The one layout ``cache`` can be; raise when several fit [LAYOUT-4]."""
        raise NotProvided

    # paged requests --------------------------------------------------------------
    def gather(self, cache: Any, block_ids: list[int], seq_len: int) -> RequestKV:
        """A request from a :class:`~kvspec.paged.PagedCache` by block ids [PAGED-1..3]."""
        raise NotProvided

    def scatter(self, kv: RequestKV, cache: Any, block_ids: list[int]) -> None:
        """Write ``kv`` into the cache's blocks in place; refuse bad tables [PAGED-2..5]."""
        raise NotProvided

    # oracle ------------------------------------------------------------------------
    def oracle_fill(
        self,
        model: ModelShape,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> RequestKV:
        """The coordinate-hash values of a region of one request [ORACLE-1..4]."""
        raise NotProvided

    # keys and ports -------------------------------------------------------------------
    def rank_aware_key(
        self, request_id: str, from_stage: int, chunk_id: int, from_rank: int, to_rank: int
    ) -> str:
        """The rank-aware connector key; raise for inputs outside the domain [KEY-1, KEY-3]."""
        raise NotProvided

    def legacy_key(self, request_id: str, from_stage: int, to_stage: int) -> str:
        """The legacy key of two single-rank stages [KEY-2, KEY-3]."""
        raise NotProvided

    def send_keys(
        self, case: TransferCase, request_id: str, src: int, *, from_stage: int, to_stage: int
    ) -> Sequence[tuple[str, int]]:
        """``(key, target rank)`` for everything sender ``src`` sends [KEY-4]."""
        raise NotProvided

    def recv_keys(
        self, case: TransferCase, request_id: str, dst: int, *, from_stage: int, to_stage: int
    ) -> Sequence[tuple[str, int]]:
        """``(key, source rank)`` for everything receiver ``dst`` expects [KEY-4]."""
        raise NotProvided

    def kv_port(self, base: int, stage: int, rank: int, replica: int) -> int:
        """The KV port of sender (stage, rank, replica); raise outside the domain [PORT-1..3]."""
        raise NotProvided

    # payloads and the wire ----------------------------------------------------------
    def merge(self, case: TransferCase, dst: int, received: Sequence[tuple[int, Any]]) -> Any:
        """Receiver ``dst``'s shard from ``(source rank, Payload)`` pairs in arrival order
        [PAYLOAD-3]; refuse shards that disagree."""
        raise NotProvided

    def reassemble(self, chunks: Sequence[Any]) -> Any:
        """One whole-request :class:`~kvspec.payload.Payload` from its chunks [CHUNK-2]."""
        raise NotProvided

    def encode(self, payload: Any) -> Sequence[Any]:
        """The frames of a :class:`~kvspec.payload.Payload` in the spec's format [WIRE-1]."""
        raise NotProvided

    def decode(self, frames: Sequence[bytes]) -> Any:
        """The payload of a list of frames; refuse anything malformed [WIRE-4]."""
        raise NotProvided


def provided_capabilities(adapter: Adapter) -> set[str]:
    """Capabilities whose every method the adapter overrides."""
    cls = type(adapter)
    return {
        name
        for name, methods in CAPABILITIES.items()
        if all(getattr(cls, m) is not getattr(Adapter, m) for m in methods)
    }


class AdapterError(Exception):
    """The adapter cannot be loaded or is malformed; the message says why."""


BUILTIN: dict[str, str] = {
    "reference": "kvspec.conformance.reference:ReferenceAdapter",
    # Engines in the field: each imports the engine's installed package when created and
    # refuses with what to install when it is missing (kvspec/adapters, `make field`).
    "vllm-omni": "kvspec.adapters.vllm_omni:VllmOmniAdapter",
    "vllm-nixl": "kvspec.adapters.vllm_nixl:VllmNixlAdapter",
    "sglang": "kvspec.adapters.sglang:SglangAdapter",
}
"""Adapters reachable by a built-in name."""


def load_adapter(spec: str) -> Adapter:
    """Load ``spec``: a built-in name or ``MODULE:ATTR`` (an adapter or a factory).

    The current directory is importable, so ``my_adapter:adapter`` finds
    ``./my_adapter.py``. Every failure raises :class:`AdapterError` with the reason.
    """
    target = BUILTIN.get(spec, spec)
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise AdapterError(
            f"{spec!r} is neither a built-in adapter ({', '.join(BUILTIN)}) nor MODULE:ATTR"
        )
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise AdapterError(f"cannot import {module_name!r}: {error!r}") from error
    try:
        obj: Any = getattr(module, attr)
    except AttributeError:
        raise AdapterError(f"module {module_name!r} has no attribute {attr!r}") from None
    if inspect.isclass(obj) or (callable(obj) and not isinstance(obj, Adapter)):
        try:
            obj = obj()
        except AdapterError:
            raise
        except Exception as error:
            raise AdapterError(f"calling {target} with no arguments failed: {error!r}") from error
    check_adapter(obj, where=target)
    return obj


def check_adapter(obj: object, *, where: str) -> None:
    """Refuse an object that is not a well-formed adapter, saying what is wrong."""
    if not isinstance(obj, Adapter):
        raise AdapterError(
            f"{where} gave {type(obj).__name__}, not an instance of "
            "kvspec.conformance.Adapter (subclass it and override the capabilities you have)"
        )
    unknown_policies = set(obj.policies) - set(POLICIES)
    if unknown_policies:
        raise AdapterError(
            f"{where}: policies {sorted(unknown_policies)} are not spec policies {POLICIES}"
        )
    unknown_modes = set(obj.slicing_modes) - set(SLICING_MODES)
    if unknown_modes or not obj.slicing_modes:
        raise AdapterError(
            f"{where}: slicing_modes must be a non-empty subset of {SLICING_MODES}, got "
            f"{obj.slicing_modes!r}"
        )
    if not provided_capabilities(obj):
        raise AdapterError(
            f"{where} overrides no capability; override at least one of "
            + ", ".join(f"{c} ({', '.join(m)})" for c, m in CAPABILITIES.items())
        )
