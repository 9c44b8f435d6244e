"""SGLang's disaggregation mapping, through kvspec: ``kvspec conform sglang``.

Checks the installed ``sglang`` package (pinned in field/requirements/sglang.txt;
sglang 0.5.23), nothing copied, all in ``sglang/srt/disaggregation/``:

- ``common/conn.py`` ``CommonKVManager._resolve_rank_mapping``: which prefill TP and PP
  ranks a decode rank takes KV from (for MLA, the one real sender; the others get dummy
  messages). It is a method that reads nine plain attributes; the adapter calls it with
  those attributes and a real ``PrefillServerInfo``.
- ``common/conn.py`` ``CommonKVManager.get_mha_kv_ptrs_with_pp``: which decode layer each
  prefill layer is written into, called with layer ids in place of buffer addresses.
- ``common/staging_buffer.py`` ``compute_head_slice_params``: which heads a prefill rank
  sends to a decode rank, and where they land.
- ``mooncake/conn.py`` (send loop): MLA and equal TP send whole pages, other TP pairs
  send head slices.
- ``sglang/srt/distributed/utils.py`` ``get_pp_indices``: each pipeline stage's layers,
  by SGLang's default rule (its extra layers go to the *last* stages) unless
  ``SGLANG_PP_LAYER_PARTITION`` names a partition; the adapter's
  :meth:`SglangAdapter.layer_partition`, so generated stages carry SGLang's own split.

The engine's contract (what a failure is judged against, issue 28), each read in the
installed 0.5.23 package:

- replica rule: ``rank // ratio`` (kvspec/topology/field_policies.py
  ``sglang_rank_ratio``), and every prefill rank of a fan-in window sends, replicas
  included, with the decode counting them (``required_prefill_response_num =
  info.attn_tp_size // self.attn_tp_size`` in ``_resolve_rank_mapping``):
  ``replicas_write = "every"``;
- refusals: ``assert`` (``AssertionError``: ``_resolve_rank_mapping``, the server-args
  checks, ``make_layers``, the attention layers' head checks), ``ValueError``
  (``get_pp_indices``) and ``KVTransferError`` (common/conn.py: a transfer that fails);
- inputs SGLang generates itself: :data:`SERVING_NEVER_PRODUCES`;
- start-up validation (:meth:`SglangAdapter.serving_accepts`): ``ServerArgs`` resolution
  and ``check_server_args`` for each side, the model-load checks, and the decode's
  handshake mapping.

SGLang pushes byte ranges computed from these numbers; the byte arithmetic itself needs a
manager with registered memory and is not reached (field/NOTES.md). Importing SGLang's
config package needs torchvision, whose PyPI wheels cannot load next to CPU torch; the
adapter answers those imports with inert modules (``_engine.stand_in_if_unusable``).

The functions above the adapter class are pure translation and need no engine.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType, MethodType, SimpleNamespace
from typing import Any, Literal

import torch

from kvspec.adapters._engine import (
    engine_message,
    import_engine,
    invert_sources,
    stage_coords,
    stand_in_if_unusable,
)
from kvspec.conformance.adapter import Acceptance, Adapter
from kvspec.conformance.adapter.protocols import (
    PartitionsProtocol,
    ReceiverProtocol,
    RoutingProtocol,
    SenderProtocol,
    TopologyProtocol,
)
from kvspec.conformance.domain import Domain
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.testing.strategies import TP_SIZES
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import SGLANG, sglang_rank_ratio
from kvspec.topology.ownership import layer_partition
from kvspec.topology.stage import StageLayout

NAME = "sglang"
PARTITION_VARIABLE = "SGLANG_PP_LAYER_PARTITION"
"""How SGLang takes an explicit PP layer partition (sglang/srt/distributed/utils.py
``get_pp_indices``, which also refuses one of the wrong length or sum, and ignores it at
PP1). A stage whose partition is SGLang's default runs with the variable unset, as a
plain deployment does; any other partition is given through it [LAYER-2]."""
INSTALL = "sglang 0.5.23 (field/requirements/sglang.txt)"
V_OFFSET = 1 << 20
"""Layer ids stand for buffer addresses in ``get_mha_kv_ptrs_with_pp``: K of layer l is
``l``, V is ``V_OFFSET + l``."""


# -- translation: kvspec <-> SGLang (pure) -------------------------------------------------


FAN_OUT_NON_DIVIDING: tuple[tuple[int, int], ...] = tuple(
    (s, t) for s in TP_SIZES for t in TP_SIZES if t > s and t % s
)
"""Non-dividing pairs with the larger TP on the decode side (TP2 -> TP3, TP3 -> TP4):
SGLang starts with them too, but a decode rank past the prefill's reads ``target_tp_rank
= rank // (D // P)``, a prefill rank that does not exist, and every request on it fails
at bootstrap (a crash, tier breaks; tests/suite/test_adapters_sglang_contract.py). They are
left out of :data:`DOMAIN`: as the smallest failing example they would become every
transfer check's shrunk counterexample and hide the silent corruptions (the PP layer
pairing, the non-dividing fan-in) behind one request failure."""

DOMAIN = Domain(
    tp_pairs=tuple(
        (s, t) for s in TP_SIZES for t in TP_SIZES if (s, t) not in FAN_OUT_NON_DIVIDING
    ),
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    repeated_deliveries=False,
    non_dividing_tp=True,
)
"""SGLang's domain as data [PLAN-1]: fp8 is out, because kvspec's fp8 KV carries per-layer
scales [DTYPE-3] and SGLang transfers KV pages only (scales are per-server config;
sgl-project/sglang#20705); a repeated delivery cannot happen, because prefill writes land at
the decode's registered addresses [RESHARD-3]. TP pairs that do not divide are in (but
:data:`FAN_OUT_NON_DIVIDING`):
SGLang starts with them (each side's head checks pass alone, e.g. 6 KV heads on TP3 and
on TP2, and ``_resolve_rank_mapping`` checks nothing about the pair), so serving reaches
them (field/repro/sglang/non_dividing_tp.py)."""

SERVING_NEVER_PRODUCES: Mapping[str, str] = MappingProxyType(
    {
        "RESHARD-3.2": (
            "a shipment from a prefill rank the decode's own plan does not list: the decode "
            "registers its destination (bootstrap info, then its KV indices) only with the "
            "prefill ranks target_tp_ranks x target_pp_ranks of "
            "CommonKVManager._resolve_rank_mapping (CommonKVReceiver._setup_bootstrap_infos, "
            "sglang/srt/disaggregation/common/conn.py, sglang 0.5.23), and a prefill rank "
            "writes only to decode ranks that registered with it; no other rank holds the "
            "decode's addresses"
        ),
    }
)
"""Inputs of refusal probes that SGLang's serving path cannot produce, with where it
generates them itself [Adapter.serving_never_produces]."""


def pp_pair_supported(case: TransferCase) -> bool:
    """Decode PP equal to 1 or to the prefill's: ``assert self.pp_size == info.pp_size or
    self.pp_size == 1`` in ``_resolve_rank_mapping`` (what :data:`DOMAIN` cannot say)."""
    return case.target.pp in (1, case.source.pp)


def partition_setting(partition: Sequence[int] | None) -> str | None:
    """An explicit layer partition as SGLang takes it, the ``SGLANG_PP_LAYER_PARTITION``
    value (``"1,3"``); None keeps its default rule [LAYER-2]."""
    return None if partition is None else ",".join(str(n) for n in partition)


def decode_manager(case: TransferCase | SimpleNamespace, dst: int) -> SimpleNamespace:
    """The attributes of a decode ``CommonKVManager`` that ``_resolve_rank_mapping`` reads.

    ``kv_args.engine_rank`` is the decode rank's attention-TP rank; no CP, no DP.
    """
    pp_rank, tp_rank = stage_coords(dst, case.target.tp)
    return SimpleNamespace(
        is_mla_backend=case.model.attention == "mla",
        is_hybrid_mla_backend=False,
        attn_tp_size=case.target.tp,
        kv_args=SimpleNamespace(engine_rank=tp_rank),
        attn_cp_size=1,
        attn_cp_rank=0,
        enable_all_cp_ranks_for_transfer=False,
        pp_size=case.target.pp,
        pp_rank=pp_rank,
    )


def prefill_info_fields(case: TransferCase | SimpleNamespace) -> dict[str, Any]:
    """What a prefill's bootstrap server reports (``PrefillServerInfo``'s fields)."""
    return {
        "attn_tp_size": case.source.tp,
        "attn_cp_size": 1,
        "dp_size": 1,
        "pp_size": case.source.pp,
        "page_size": None,
        "kv_cache_dtype": None,
        "follow_bootstrap_room": True,
    }


def real_senders(info: Any, *, mla: bool, source_tp: int) -> list[int]:
    """Stage-local ranks of the prefill ranks that really send to a decode rank.

    ``target_tp_ranks`` are all contacted; for MLA only ``target_tp_rank`` sends KV and the
    others are dummy ranks (common/conn.py: ``is_dummy = not (target_tp_rank ==
    self.target_tp_rank or self.target_tp_rank is None)``). PP rank p, TP rank t is
    stage-local rank ``p * tp + t`` [STAGE-1].
    """
    tp_ranks = info.target_tp_ranks
    if mla and info.target_tp_rank is not None:
        tp_ranks = [info.target_tp_rank]
    return sorted(p * source_tp + t for p in info.target_pp_ranks for t in tp_ranks)


def sends_head_slices(case: TransferCase) -> bool:
    """Whether SGLang sends head slices (``send_kvcache_slice``) rather than whole pages:
    not for MLA, not for equal attention-TP sizes (mooncake/conn.py send loop)."""
    return case.model.attention != "mla" and case.source.tp != case.target.tp


def mha_config(model: Mapping[str, Any], tps: Sequence[int]) -> dict[str, Any]:
    """A Hugging Face ``config.json`` for a Llama-architecture model with ``model``'s layer
    count, KV heads and head size, as SGLang reads one at start-up. kvspec models only KV
    heads; the query heads are chosen divisible by every TP in ``tps`` (``num_kv_heads *
    prod(tps)``), so only the KV-head checks can refuse."""
    heads = int(model["num_kv_heads"])
    for tp in tps:
        heads *= max(1, int(tp))
    head_dim = int(model.get("head_dim", 1))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": heads * head_dim,
        "intermediate_size": 2 * heads * head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": int(model["num_kv_heads"]),
        "head_dim": head_dim,
        "num_hidden_layers": int(model["num_layers"]),
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }


def layer_pointers(layers: Sequence[int], *, kv: int = 2) -> list[int]:
    """Stand-in buffer addresses as SGLang lists a stage's buffers: ``[K of each layer...,
    V of each layer...]`` for MHA, one latent per layer for MLA (``kv=1``)."""
    pointers = list(layers)
    if kv == 2:
        pointers += [V_OFFSET + layer for layer in layers]
    return pointers


def pointer_target(pointer: int) -> tuple[int, int]:
    """``(0 for K or 1 for V, layer)`` of a stand-in address."""
    return (1, pointer - V_OFFSET) if pointer >= V_OFFSET else (0, pointer)


def paired_writes(
    src_pointers: Sequence[Sequence[int]], dst_pointers: Sequence[Sequence[int]]
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``((K/V, prefill layer), (K/V, decode layer))`` for every write SGLang pairs up:
    list i of ``src_pointers`` is written, element by element, to list i of
    ``dst_pointers`` as far as both reach (its transfer loops zip them)."""
    return [
        (pointer_target(s), pointer_target(d))
        for srcs, dsts in zip(src_pointers, dst_pointers, strict=True)
        for s, d in zip(srcs, dsts, strict=False)
    ]


# -- the adapter ---------------------------------------------------------------------------


class SglangAdapter(
    Adapter, PartitionsProtocol, RoutingProtocol, TopologyProtocol, SenderProtocol, ReceiverProtocol
):
    """SGLang's disaggregation mapping (``sglang``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    policies = (SGLANG,)
    policy_rules = MappingProxyType({SGLANG: sglang_rank_ratio})
    slicing_modes = ("sender",)  # the prefill side always cuts
    replicas_write = "every"  # required_prefill_response_num counts every window rank
    serving_never_produces = SERVING_NEVER_PRODUCES

    def __init__(self) -> None:
        stand_in_if_unusable("torchvision")
        self.conn = import_engine(
            "sglang.srt.disaggregation.common.conn", adapter=NAME, install=INSTALL
        )
        self.staging = import_engine(
            "sglang.srt.disaggregation.common.staging_buffer", adapter=NAME, install=INSTALL
        )
        self.utils = import_engine("sglang.srt.distributed.utils", adapter=NAME, install=INSTALL)
        import sglang

        self.version = f"sglang {sglang.__version__}"
        self.refusal_types = (AssertionError, ValueError, self.conn.KVTransferError)

    # the engine's own split [LAYER-1, LAYER-2] ---------------------------------------------
    def layer_partition(self, num_layers: int, pp: int) -> Sequence[int] | None:
        return _default_split(self.utils.get_pp_indices, num_layers, pp)

    def _setting(self, layout: StageLayout, num_layers: int) -> str | None:
        """``SGLANG_PP_LAYER_PARTITION`` for a stage: unset when its partition is SGLang's
        default, else that partition (kvspec's own [LAYER-1] included)."""
        split = list(layer_partition(layout, num_layers))
        default = list(_default_split(self.utils.get_pp_indices, num_layers, layout.pp))
        return None if layout.pp == 1 or split == default else partition_setting(split)

    def _layers(self, layout: StageLayout, num_layers: int, pp_rank: int) -> list[int]:
        """The layers SGLang gives PP rank ``pp_rank`` of ``layout`` (``get_pp_indices``)."""
        with _environment(PARTITION_VARIABLE, self._setting(layout, num_layers)):
            start, end = self.utils.get_pp_indices(num_layers, pp_rank, layout.pp)
        return list(range(start, end))

    def supports(self, case: TransferCase) -> bool:
        return pp_pair_supported(case)

    def _rank_mapping(self, case: TransferCase, dst: int) -> Any:
        if case.policy != SGLANG:
            raise ValueError(
                f"SGLang has one replica rule, {SGLANG!r} (_resolve_rank_mapping); policy "
                f"{case.policy!r} cannot be configured [PLAN-4.4]"
            )
        info = self.conn.PrefillServerInfo(**prefill_info_fields(case))
        self.conn.CommonKVManager._resolve_rank_mapping(decode_manager(case, dst), info)
        absent = [r for r in info.target_tp_ranks if not 0 <= r < case.source.tp]
        if absent:
            # The decode asks the prefill's bootstrap server for ranks it does not have
            # (a TP pair that does not divide, e.g. TP3 -> TP4): CommonKVReceiver.
            # _setup_bootstrap_infos records this failure and the request fails.
            raise self.conn.KVTransferError(
                0,
                f"Could not fetch bootstrap info for: target_tp_rank: {absent[0]} (decode "
                f"rank {dst}; the prefill has attention TP {case.source.tp})",
            )
        return info

    # routing [PLAN-2, PLAN-3] ------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        info = self._rank_mapping(case, dst)
        return real_senders(info, mla=case.model.attention == "mla", source_tp=case.source.tp)

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        # Prefill ranks send to every decode rank that registers for the room.
        readers = {dst: self.sources(case, dst) for dst in case.target.ranks()}
        return invert_sources(readers, case.source.ranks())[src]

    # what is sent and where it lands [SLICE-1, RESHARD-2] --------------------------------
    def _heads(self, case: TransferCase, src: int, dst: int) -> tuple[int, int, int]:
        """(first prefill head, count, first decode head) of the edge, shard-relative."""
        if not sends_head_slices(case):
            return 0, 0, 0  # whole pages
        src_head, count, dst_head, _ = self.staging.compute_head_slice_params(
            case.source.tp,
            case.target.tp,
            stage_coords(src, case.source.tp)[1],
            stage_coords(dst, case.target.tp)[1],
            case.model.num_kv_heads,
        )
        return src_head, count, dst_head

    def _cut(self, case: TransferCase, src: int, dst: int, shard: RequestKV) -> RequestKV:
        src_head, count, _ = self._heads(case, src, dst)
        return shard if not count else shard.head_slice(src_head, src_head + count)

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        # A prefill rank sends its whole pipeline stage's layers.
        return {dst: self._cut(case, src, dst, shard) for dst in self.targets(case, src)}

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        expected = list(self.sources(case, dst))
        by_source = {s.edge.src: s for s in shipments}
        missing = [src for src in expected if src not in by_source]
        if missing:
            # required_prefill_response_num responses never arrive: the request fails
            # (a timeout, recorded as the room's KVTransferError).
            raise self.conn.KVTransferError(
                0, f"decode rank {dst} still waits for prefill ranks {missing}"
            )
        dst_pp = stage_coords(dst, case.target.tp)[0]
        dst_layers = self._layers(case.target, case.model.num_layers, dst_pp)
        heads = (
            1
            if case.model.attention == "mla"
            else max(1, case.model.num_kv_heads // case.target.tp)
        )
        first = shipments[0].kv.data
        # Room past the shard's heads: a head slice SGLang places beyond them (a TP pair
        # that does not divide: 2 heads at 2..3 of a 3-head row) lands outside this
        # token's row in the real cache, silently; it is cut off below, not refused.
        spill = max(s.kv.data.shape[3] for s in shipments)
        out = torch.zeros(
            (len(dst_layers), first.shape[1], first.shape[2], heads + spill, first.shape[4]),
            dtype=first.dtype,
            device=first.device,
        )
        for src in expected:
            s = by_source[src]
            kv = s.kv if s.marker.applied else self._cut(case, src, dst, s.kv)
            _, count, dst_head = self._heads(case, src, dst)
            # a shipment cut to the spec's edge may hold fewer heads than SGLang's slice
            count = min(count or kv.data.shape[3], kv.data.shape[3])
            for (src_kv, src_layer), (dst_kv, dst_layer) in self._writes(case, src, dst_layers):
                if src_layer not in s.edge.layers:
                    continue  # not in this shipment (kvspec ships only shared layers)
                row = kv.data[s.edge.layers.index(src_layer), src_kv]
                out[dst_layers.index(dst_layer), dst_kv, :, dst_head : dst_head + count] = row
        return RequestKV(out[:, :, :, :heads].contiguous())

    def layer_writes(self, case: TransferCase, dst: int) -> dict[int, list]:
        """Every layer-buffer write into decode rank ``dst``, by prefill rank: ``((0 for K
        or 1 for V, prefill layer), (K/V, decode layer))`` as SGLang pairs them (for the
        impact sweep, field/impact/sglang_pp_pairing.py)."""
        dst_pp = stage_coords(dst, case.target.tp)[0]
        dst_layers = self._layers(case.target, case.model.num_layers, dst_pp)
        return {src: self._writes(case, src, dst_layers) for src in self.sources(case, dst)}

    def _writes(self, case: TransferCase, src: int, dst_layers: list[int]) -> list:
        """Where each prefill layer buffer of ``src``'s stage is written on the decode side:
        ``get_mha_kv_ptrs_with_pp`` (MHA) or ``get_mla_kv_ptrs_with_pp`` (MLA), called with
        layer ids in place of addresses."""
        pp_rank = stage_coords(src, case.source.tp)[0]
        src_layers = self._layers(case.source, case.model.num_layers, pp_rank)
        manager = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=src_layers[0]))
        # The MLA pairing calls one more method of its own; bind the engine's.
        manager._mla_kv_entry_span_with_pp = MethodType(
            self.conn.CommonKVManager._mla_kv_entry_span_with_pp, manager
        )
        kv = case.model.kv_tensors
        src_ptrs, dst_ptrs = layer_pointers(src_layers, kv=kv), layer_pointers(dst_layers, kv=kv)
        if kv == 1:
            srcs, dsts, _ = self.conn.CommonKVManager.get_mla_kv_ptrs_with_pp(
                manager, src_ptrs, dst_ptrs
            )
            return paired_writes([srcs], [dsts])
        src_k, src_v, dst_k, dst_v, _ = self.conn.CommonKVManager.get_mha_kv_ptrs_with_pp(
            manager, src_ptrs, dst_ptrs
        )
        return paired_writes([src_k, src_v], [dst_k, dst_v])

    # refusals: the stage pair in its rank mapping [PLAN-1], layer partitions in its
    # pipeline set-up [LAYER-1, LAYER-2]; model checks need its bootstrap server ----------
    def validate_topology(self, config: TransferConfig) -> None:
        case = SimpleNamespace(
            source=SimpleNamespace(**{"pp": 1, **config["source"]}),
            target=SimpleNamespace(**{"pp": 1, **config["target"]}),
            model=SimpleNamespace(attention=config["model"].get("attention", "mha")),
        )
        rank = config.get("rank", {})
        dst = rank.get("rank", 0) if rank.get("side") == "target" else 0
        info = self.conn.PrefillServerInfo(**prefill_info_fields(case))
        self.conn.CommonKVManager._resolve_rank_mapping(decode_manager(case, dst), info)

    def validate_partition(self, config: TransferConfig) -> None:
        num_layers = config["model"]["num_layers"]
        for side in ("source", "target"):
            layout = config[side]
            pp, partition = layout.get("pp", 1), layout.get("layer_partition")
            self._check_layer_count(num_layers, pp)
            with _environment(PARTITION_VARIABLE, partition_setting(partition)):
                for pp_rank in range(pp):
                    self.utils.get_pp_indices(num_layers, pp_rank, pp)

    def _check_layer_count(self, num_layers: int, pp: int) -> None:
        """SGLang's model-load check of layers against PP: ``make_layers``
        (sglang/srt/utils/common.py) asserts ``num_hidden_layers >= pp_size`` before it
        builds a layer; called with a layer factory that stops it there."""
        common = import_engine("sglang.srt.utils.common", adapter=NAME, install=INSTALL)
        try:
            common.make_layers(num_layers, _stop_building, pp_rank=0, pp_size=pp)
        except _Built:
            return
        except AssertionError as error:
            raise AssertionError(
                f"{engine_message(error)} with num_hidden_layers={num_layers}, pp_size={pp}"
            ) from error

    # start-up validation [serving reachability] -------------------------------------------
    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        """Whether SGLang starts a prefill/decode pair with ``config`` and can hand over a
        request, by its own code, on CPU:

        1. each side's ``ServerArgs(model_path=<config.json>, tp_size, pp_size,
           disaggregation_mode="prefill"|"decode", device="cpu")``: ``resolve_once()``
           (the resolution pipeline, reading the model's config) and
           ``check_server_args()`` (sglang/srt/arg_groups/validation_hook.py);
        2. each side's model-load checks: ``make_layers``'s layers >= PP assert,
           ``get_pp_indices`` for every stage (with ``SGLANG_PP_LAYER_PARTITION`` for a
           partition that is not SGLang's default), and for MHA ``LlamaAttention``'s
           head checks (``total_num_kv_heads % tp_size`` or ``tp_size %
           total_num_kv_heads``, sglang/srt/models/llama.py), run by calling its
           ``__init__`` with the side's TP size until it passes them;
        3. the decode's handshake, ``CommonKVManager._resolve_rank_mapping`` for every
           decode rank.

        What is not run: loading weights and building process groups (no GPU); for MLA
        the model-load head check (a latent is whole on every rank; the server-args step
        runs on a Llama config with the same layer count)."""
        model, ran = config["model"], []
        mla = model.get("attention") == "mla"
        facts = dict(model, num_kv_heads=1) if mla else model
        tps = (config["source"]["tp"], config["target"]["tp"])
        path = _model_dir(json.dumps(mha_config(facts, tps), sort_keys=True))
        sides: tuple[tuple[Literal["source", "target"], str], ...] = (
            ("source", "prefill"),
            ("target", "decode"),
        )
        try:
            for side, mode in sides:
                layout = config[side]
                tp, pp = layout["tp"], layout.get("pp", 1)
                self._server_args(path, tp, pp, mode)
                ran.append(f"{mode} TP{tp} PP{pp}: ServerArgs.resolve_once, check_server_args")
                self._check_layer_count(model["num_layers"], pp)
                partition = layout.get("layer_partition")
                default = _default_split(self.utils.get_pp_indices, model["num_layers"], pp)
                setting = None if partition in (None, default) else partition_setting(partition)
                with _environment(PARTITION_VARIABLE, setting):
                    for pp_rank in range(pp):
                        self.utils.get_pp_indices(model["num_layers"], pp_rank, pp)
                ran.append(f"{mode}: make_layers, get_pp_indices")
                if not mla:
                    self._check_heads(model["num_kv_heads"], tp)
                    ran.append(f"{mode}: LlamaAttention head checks")
            case = SimpleNamespace(
                source=SimpleNamespace(**{"pp": 1, **config["source"]}),
                target=SimpleNamespace(**{"pp": 1, **config["target"]}),
                model=SimpleNamespace(attention=model.get("attention", "mha")),
            )
            for dst in range(config["target"]["tp"] * config["target"].get("pp", 1)):
                info = self.conn.PrefillServerInfo(**prefill_info_fields(case))
                self.conn.CommonKVManager._resolve_rank_mapping(decode_manager(case, dst), info)
            ran.append("decode handshake: _resolve_rank_mapping for every decode rank")
        except (AssertionError, ValueError) as error:
            said = str(error) if error.__cause__ is not None else engine_message(error)
            return Acceptance(False, f"{self.version} refuses it: {said}")
        return Acceptance(True, f"{self.version} accepts it ({'; '.join(ran)})")

    def _server_args(self, path: str, tp: int, pp: int, mode: str) -> None:
        _server_args_check(path, tp, pp, mode)

    def _check_heads(self, num_kv_heads: int, tp: int) -> None:
        _head_check(int(num_kv_heads), int(tp))


class _Built(Exception):
    """Raised by :func:`_stop_building`: ``make_layers`` got past its checks."""


def _stop_building(**_: Any) -> Any:
    raise _Built


def _default_split(get_pp_indices: Any, num_layers: int, pp: int) -> list[int]:
    """SGLang's default split: ``get_pp_indices`` for every stage, the partition variable
    unset."""
    with _environment(PARTITION_VARIABLE, None):
        bounds = [get_pp_indices(num_layers, rank, pp) for rank in range(pp)]
    return [end - start for start, end in bounds]


@functools.lru_cache(maxsize=64)
def _model_dir(config_json: str) -> str:
    """A directory holding ``config_json`` as ``config.json`` (one per model)."""
    path = Path(tempfile.mkdtemp(prefix="kvspec-sglang-model-"))
    (path / "config.json").write_text(config_json)
    return str(path)


@functools.lru_cache(maxsize=256)
def _server_args_check(path: str, tp: int, pp: int, mode: str) -> None:
    """SGLang's own server-argument resolution and checks for one side (cached: a
    ``ServerArgs`` resolves once)."""
    server_args = import_engine("sglang.srt.server_args", adapter=NAME, install=INSTALL)
    args = server_args.ServerArgs(
        model_path=path, tp_size=tp, pp_size=pp, disaggregation_mode=mode, device="cpu"
    )
    args.resolve_once()
    args.check_server_args()


@functools.lru_cache(maxsize=256)
def _head_check(num_kv_heads: int, tp: int) -> None:
    """``LlamaAttention.__init__``'s head checks at TP ``tp``: called on a bare instance
    with ``get_parallel()`` answering that TP size; it passed them once it has set
    ``num_kv_heads`` (what follows needs process groups and fails here, harmlessly)."""
    llama = import_engine("sglang.srt.models.llama", adapter=NAME, install=INSTALL)
    config = SimpleNamespace(**mha_config({"num_kv_heads": num_kv_heads, "num_layers": 1}, (tp,)))
    attention = llama.LlamaAttention.__new__(llama.LlamaAttention)
    real = llama.get_parallel
    llama.get_parallel = lambda: SimpleNamespace(tp_size=tp)
    try:
        llama.LlamaAttention.__init__(
            attention, config, config.hidden_size, config.num_attention_heads, num_kv_heads
        )
    except AssertionError as error:
        if hasattr(attention, "num_kv_heads"):
            return
        raise AssertionError(
            f"{engine_message(error)} with total_num_kv_heads={num_kv_heads}, tp_size={tp}"
        ) from error
    except Exception:
        if not hasattr(attention, "num_kv_heads"):
            raise
    finally:
        llama.get_parallel = real


@contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` set to ``value`` (unset for None) for the block's duration."""
    old = os.environ.get(name)
    try:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
