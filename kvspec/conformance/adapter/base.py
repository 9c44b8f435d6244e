"""The :class:`Adapter` base class: every capability's methods, each raising
:class:`~kvspec.conformance.adapter.contract.NotProvided` until an adapter overrides it,
and the attributes that declare what the implementation handles and its contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch

from kvspec.conformance.adapter.contract import (
    Acceptance,
    NotProvided,
)
from kvspec.conformance.domain import FIRST_RELEASE, Domain
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.memory.descriptors import RegisteredCache
from kvspec.memory.paged import PagedCache
from kvspec.naming.ports import PortScheme
from kvspec.strategies import TransferCase
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import ReplicaRule
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens
from kvspec.transport.payload import Payload


class Adapter:
    """Base class of every adapter; the defaults provide nothing.

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
      PLAN-2, PLAN-3 and determinism, and routing against the rule [PLAN-4].
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

    # ownership ------------------------------------------------------------------
    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        """(heads, layers) stage-local ``rank`` holds [STAGE-1, STAGE-2, HEAD-1..3,
        LAYER-1..2]."""
        raise NotProvided

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        """The tokens of a ``seq_len``-token request stage-local ``rank`` holds, as ascending
        ranges of global token positions [CP-1, CP-3]; every token without token shards."""
        raise NotProvided

    # routing --------------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        """Source ranks receiver ``dst`` takes KV from [PLAN-2, PLAN-3], under the replica
        policy ``case.policy`` [PLAN-4].

        Refuse (raise) a ``case.policy`` the implementation does not implement, one in
        neither :attr:`policies` nor :attr:`policy_rules`, rather than route under another
        policy [PLAN-4.4]."""
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
        marker and its KV; the slice is applied (by the sender, or by
        :meth:`apply_marker` when the adapter has it). Refuse (raise) what cannot be
        combined.
        """
        raise NotProvided

    # the slice marker ---------------------------------------------------------------
    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        """Receiver ``dst``'s slice step for one shipment [SLICE-3].

        Cut an unapplied slice once and mark it applied by the receiver; return an
        applied one unchanged; refuse (raise) one marked for another rank. Adapters
        whose receiver applies slices inside :meth:`receiver_combine` may leave this out.
        """
        raise NotProvided

    # rejection ------------------------------------------------------------------
    # Engines refuse a bad configuration in different places: parallel sizes when they
    # create process groups, layer partitions in their pipeline set-up, the pair of
    # stages in the transfer code, model facts (heads over TP among them) when the model
    # loads and its attention layers are built, the two stages' agreement in a
    # handshake. One method each, so an adapter provides what its engine's transfer code
    # really does. Every ``config`` is plain data, a TransferConfig: its keys, their types,
    # meanings and examples are data in kvspec/conformance/transfer_config.py, which the
    # suite holds every configuration it hands out to and docs/adapter-api.md is rendered
    # from. Attention groups that do not fit TP are parallel sizes [STAGE-2]; token rules,
    # DCP and DP ranks are refused with the pair of stages [CP-1..3, DP-1, PLAN-6].

    def validate_sizes(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses these parallel sizes: TP and PP of at least
        1, a rank inside its stage [STAGE-1]."""
        return self._legacy_validate(config)

    def validate_partition(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses these pipeline layer partitions
        [LAYER-1, LAYER-2]."""
        return self._legacy_validate(config)

    def validate_topology(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses to transfer between these two stages
        [PLAN-1]."""
        return self._legacy_validate(config)

    def validate_model(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses these model facts, its head count over
        either side's TP included [MODEL-1, MODEL-2, DTYPE-1, HEAD-1, HEAD-2]."""
        return self._legacy_validate(config)

    def validate_agreement(self, config: TransferConfig) -> None:
        """Raise if the implementation refuses a receiver whose model facts
        (``target_model``) differ from the sender's (``model``) [MODEL-3]."""
        return self._legacy_validate(config)

    def validate(self, config: TransferConfig) -> None:
        """Deprecated: one method for every ``validate_*`` above."""
        raise NotProvided

    def _legacy_validate(self, config: TransferConfig) -> None:
        if _overrides(type(self), "validate"):
            return self.validate(config)
        raise NotProvided

    # cache layouts ---------------------------------------------------------------
    def read_layer(
        self, cache: Any, layout: str, *, page_size: int | None = None
    ) -> tuple[Any, ...]:
        """K and V (or the latent) of one layer's cache in the named ``layout``, each
        ``[num_blocks, block_size, heads, head_dim]`` and a view of the cache [LAYOUT-1, 2];
        a cross-layer cache reads ``[layers, ...]`` [LAYOUT-5].

        ``page_size`` is given for a token pool (``sglang_mha``, ``sglang_mla``), whose
        page size is not in its shape [LAYOUT-5]; an adapter whose method does not take it
        is not asked to read token pools."""
        raise NotProvided

    def convert_layout(
        self,
        cache: Any,
        source: str,
        target: str,
        *,
        page_size: int | None = None,
        block_size: int | None = None,
    ) -> Any:
        """A new cache in ``target`` holding ``cache``'s slots bit for bit [LAYOUT-3, 6], in
        blocks of ``block_size`` (default: the source's); ``page_size`` is a token pool's
        page size, as for :meth:`read_layer`. An adapter whose method does not take
        ``block_size`` is not asked to re-block."""
        raise NotProvided

    def read_fields(
        self, cache: Any, layout: str, *, page_size: int | None = None
    ) -> dict[str, Any]:
        """Every field of the cells of one layer's cache, inline scales included, by name
        (``k``, ``v``, ``k_scale``, ``latent``, ``nope``, ...), each a view in its own dtype,
        ``[num_blocks, block_size, heads, width]`` [LAYOUT-6]."""
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
    def gather(self, cache: PagedCache, block_ids: list[int], seq_len: int) -> RequestKV:
        """A request from a :class:`~kvspec.memory.paged.PagedCache` by block ids [PAGED-1..3]."""
        raise NotProvided

    def scatter(self, kv: RequestKV, cache: PagedCache, block_ids: list[int]) -> None:
        """Write ``kv`` into the cache's blocks in place; refuse bad tables [PAGED-2..5]."""
        raise NotProvided

    # byte-range descriptors --------------------------------------------------------
    def descriptors(
        self,
        case: TransferCase,
        src: int,
        dst: int,
        source: RegisteredCache,
        source_ids: list[int],
        target: RegisteredCache,
        target_ids: list[int],
        tokens: range,
    ) -> Sequence[Any]:
        """The byte ranges a pull connector posts to realise edge ``src`` -> ``dst`` for
        ``tokens`` [DESC-1, DESC-2]: each ``(src region, src offset, dst region, dst offset,
        length)``. ``source`` and ``target`` are the two ranks'
        :class:`~kvspec.memory.descriptors.RegisteredCache` (layout, block size, the heads
        and layers each holds, region names and registered sizes); the ids are the
        request's blocks on each side. Refuse (raise) what cannot be done inside the
        registered regions. Lists are judged by what they write, in any order and any
        granularity; set :attr:`coalesces` to be held to the minimum count [DESC-3]."""
        raise NotProvided

    # oracle ------------------------------------------------------------------------
    def oracle_fill(
        self,
        model: ModelShape,
        request_id: str,
        *,
        tokens: range | Tokens,
        layers: range,
        heads: range,
        seed: int,
    ) -> RequestKV:
        """The coordinate-hash values of a region of one request [ORACLE-1..4]; ``tokens``
        may be a token set (a context-parallel rank's tokens, in ascending order)."""
        raise NotProvided

    def oracle_verify(
        self,
        kv: RequestKV,
        model: ModelShape,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> int:
        """How many elements and fp8 scales of ``kv`` differ from the oracle's [ORACLE-5];
        raise for KV of another shape or dtype than the ranges imply."""
        raise NotProvided

    # layer groups of hybrid models ----------------------------------------------------
    def state_units(
        self, layout: StageLayout, model: ModelShape, group: int, rank: int
    ) -> Mapping[str, range]:
        """Each part's units of state group ``group`` that stage-local ``rank`` holds, by
        part name (``x``, ``B``, ``C``, ``ssm``; ``Q``, ``K``, ``V``; ``conv``) [STATE-1]."""
        raise NotProvided

    def state_reads(
        self, case: TransferCase, group: int, dst: int
    ) -> Sequence[tuple[int, int, int, int, int]]:
        """The reads that fill receiver ``dst``'s state of group ``group``: each ``(src, layer,
        src offset, dst offset, length)`` in elements of one rank's state layer (its parts in
        order, each unit contiguous) [STATE-2]."""
        raise NotProvided

    def group_bytes(
        self, case: TransferCase, seq_len: int, block_size: int
    ) -> Mapping[tuple[int, int, int], int]:
        """Bytes each edge moves of each layer group for a ``seq_len``-token request, keyed
        ``(group, src, dst)``; sliding windows aligned to ``block_size`` [GROUP-3, WINDOW-1]."""
        raise NotProvided

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> Mapping[tuple[int, int, int], Sequence[tuple[int, int]]]:
        """The tokens each edge of each sliding-window or chunked group carries, keyed
        ``(group, src, dst)``, as ``[start, stop)`` ranges, when the sender's blocks hold
        ``source_block_size`` tokens and the receiver's ``target_block_size``; raise
        (``ValueError``) to refuse a plan whose receiver needs tokens the sender has
        evicted [WINDOW-2]."""
        raise NotProvided

    def hybrid_block_size(self, model: ModelShape, attn_tp: int, block_size: int | None) -> int:
        """The attention block size a stage of attention TP ``attn_tp`` uses for ``model``,
        ``block_size`` the user's (None: not given) [BLOCK-1]."""
        raise NotProvided

    def state_oracle(
        self,
        model: ModelShape,
        group: int,
        request_id: str,
        *,
        layers: tuple[int, ...],
        attn_tp: int,
        attn_tp_rank: int,
        seed: int,
    ) -> Mapping[str, torch.Tensor]:
        """The state oracle's values of ``layers`` of state group ``group`` that
        attention-TP rank ``attn_tp_rank`` of ``attn_tp`` holds: by part name,
        ``[layers, units held, width * rows]`` in the part's dtype [ORACLE-7]."""
        raise NotProvided

    def state_offset(
        self,
        layout: str,
        model: ModelShape,
        group: int,
        *,
        attn_tp: int,
        attn_tp_rank: int,
        page_size: int | None,
        block: int,
        part: str,
        unit: int,
        element: int,
    ) -> int:
        """Byte offset, in one state layer's buffer under state layout ``layout``
        (``vllm_conv_sd``, ``vllm_conv_ds``), of element ``element`` of global unit ``unit``
        of part ``part`` in block ``block``, as attention-TP rank ``attn_tp_rank`` of
        ``attn_tp`` keeps it; ``page_size`` None is the state's own bytes [SLAYOUT-1]. Raise
        for an unknown layout, a page that cannot hold the state aligned, a unit the rank
        does not hold or an element outside its unit."""
        raise NotProvided

    def state_runs(
        self,
        layout: str,
        model: ModelShape,
        group: int,
        *,
        attn_tp: int,
        attn_tp_rank: int,
        page_size: int | None,
        block: int,
        part: str,
        units: range,
    ) -> Sequence[tuple[int, int]]:
        """The bytes holding ``units`` of ``part`` in block ``block``, as ``(offset, nbytes)``
        runs in address order, adjacent runs merged [SLAYOUT-2]."""
        raise NotProvided

    def record_fill(
        self,
        model: ModelShape,
        layout: str,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> Mapping[str, Any]:
        """Every field of the cells of a region of one request in a record ``layout``
        (``k``, ``k_scale``, ``nope``, ...), each ``[layers, tokens, heads, width]`` in its
        own dtype [ORACLE-6]; raise for a layout that cannot hold ``model``."""
        raise NotProvided

    def record_verify(
        self,
        fields: Mapping[str, Any],
        model: ModelShape,
        layout: str,
        request_id: str,
        *,
        tokens: range,
        layers: range,
        heads: range,
        seed: int,
    ) -> int:
        """How many elements of ``fields`` (every field, inline scales included) differ from
        the oracle's [ORACLE-6]."""
        raise NotProvided

    def record_rows(self, fields: Mapping[str, Any], model: ModelShape, layout: str) -> Any:
        """A record cache's request fields (each ``[layers, seq, heads, width]``) as the
        rows of bytes it travels as, ``[layers, kv, seq, heads, row bytes]`` in one-byte
        elements of ``model``'s dtype [LAYOUT-7]; raise for a layout without a record."""
        raise NotProvided

    def record_fields(self, rows: Any, model: ModelShape, layout: str) -> Mapping[str, Any]:
        """The fields read back from rows of bytes, each in its own dtype [LAYOUT-7]."""
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

    def stage_port(
        self,
        base: int,
        stage: int,
        layout: StageLayout,
        rank: int,
        replica: int,
        scheme: PortScheme,
    ) -> int:
        """The KV port of stage-local ``rank`` of a stage with attention-DP groups under a
        port ``scheme`` (with or without a dp_stride) [PORT-1, STAGE-2]."""
        raise NotProvided

    # payloads and the wire ----------------------------------------------------------
    def merge(
        self, case: TransferCase, dst: int, received: Sequence[tuple[int, Payload]]
    ) -> Payload:
        """Receiver ``dst``'s shard from ``(source rank, Payload)`` pairs in arrival order
        [PAYLOAD-3]; refuse shards that disagree."""
        raise NotProvided

    def reassemble(self, chunks: Sequence[Payload]) -> Payload:
        """One whole-request :class:`~kvspec.transport.payload.Payload` from its chunks
        [CHUNK-2]."""
        raise NotProvided

    def layer_groups(self, num_layers: int, groups: int) -> Sequence[range]:
        """The model's layers in ``groups`` groups, in the order they are streamed
        [STREAM-1.1]."""
        raise NotProvided

    def stream_key(
        self,
        request_id: str,
        from_stage: int,
        chunk_id: int,
        group: int,
        groups: int,
        from_rank: int,
        to_rank: int,
    ) -> str:
        """The key of layer group ``group`` of chunk ``chunk_id`` on one edge [STREAM-1.2]."""
        raise NotProvided

    def merge_layers(
        self, case: TransferCase, dst: int, group: range, received: Sequence[tuple[int, Payload]]
    ) -> RequestKV:
        """Receiver ``dst``'s :class:`~kvspec.tensors.kv.RequestKV` on the layers it owns in
        ``group``, from each source's part of the group (a Payload holding only the group's
        layers), in arrival order [STREAM-1.3]."""
        raise NotProvided

    def encode(self, payload: Payload) -> Sequence[Any]:
        """The frames of a :class:`~kvspec.transport.payload.Payload` in the spec's format
        [WIRE-1]."""
        raise NotProvided

    def decode(self, frames: Sequence[bytes]) -> Payload:
        """The payload of a list of frames; refuse anything malformed [WIRE-4]."""
        raise NotProvided

    # lifecycle -----------------------------------------------------------------------
    def lifecycle(self, num_blocks: int) -> Any:
        """A fresh instance of the implementation's transfer and block-pool state machine
        for a pool of ``num_blocks`` blocks [LIFE-1..7]: an object with ``apply(event)``,
        which raises to refuse an event the rules forbid (and then changes nothing), and
        ``snapshot()``, which returns ``{"blocks": {id: state}, "handles": {id: state},
        "requests": {id: state}}`` in the vocabulary of :mod:`kvspec.lifecycle.machine`.
        """
        raise NotProvided


def _overrides(cls: type, method: str) -> bool:
    """Whether ``cls`` overrides the base's ``method``."""
    return getattr(cls, method) is not getattr(Adapter, method)
