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

SGLang pushes byte ranges computed from these numbers; the byte arithmetic itself needs a
manager with registered memory and is not reached (field/NOTES.md). Importing SGLang's
config package needs torchvision, whose PyPI wheels cannot load next to CPU torch; the
adapter answers those imports with inert modules (``_engine.stand_in_if_unusable``).

The functions above the adapter class are pure translation and need no engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import MethodType, SimpleNamespace
from typing import Any

import torch

from kvspec.adapters._engine import (
    import_engine,
    invert_sources,
    stage_coords,
    stand_in_if_unusable,
)
from kvspec.conformance.adapter import Adapter
from kvspec.conformance.domain import Domain
from kvspec.strategies import TransferCase
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.topology.ownership import layer_ranges
from kvspec.topology.stage import StageLayout

NAME = "sglang"
PARTITION_VARIABLE = "SGLANG_PP_LAYER_PARTITION"
"""How SGLang takes an explicit PP layer partition (sglang/srt/distributed/utils.py
``get_pp_indices``, which also refuses one of the wrong length or sum). kvspec's
partitions are given to it this way; SGLang's *default* rule differs from kvspec's
[LAYER-1] (its extra layers go to the last stages), so the adapter describes every stage
by kvspec's partition, as a deployment setting the variable would."""
INSTALL = "sglang 0.5.23 (field/requirements/sglang.txt)"
V_OFFSET = 1 << 20
"""Layer ids stand for buffer addresses in ``get_mha_kv_ptrs_with_pp``: K of layer l is
``l``, V is ``V_OFFSET + l``."""


# -- translation: kvspec <-> SGLang (pure) -------------------------------------------------


DOMAIN = Domain(dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES), repeated_deliveries=False)
"""SGLang's domain as data [PLAN-1]: fp8 is out, because kvspec's fp8 KV carries per-layer
scales [DTYPE-3] and SGLang transfers KV pages only (scales are per-server config;
sgl-project/sglang#20705); a repeated delivery cannot happen, because prefill writes land at
the decode's registered addresses [RESHARD-3]."""


def pp_pair_supported(case: TransferCase) -> bool:
    """Decode PP equal to 1 or to the prefill's: ``assert self.pp_size == info.pp_size or
    self.pp_size == 1`` in ``_resolve_rank_mapping`` (what :data:`DOMAIN` cannot say)."""
    return case.target.pp in (1, case.source.pp)


def partition_setting(partition: Sequence[int] | None) -> str | None:
    """An explicit layer partition as SGLang takes it, the ``SGLANG_PP_LAYER_PARTITION``
    value (``"1,3"``); None keeps its default rule [LAYER-2]."""
    return None if partition is None else ",".join(str(n) for n in partition)


def decode_manager(case: TransferCase, dst: int) -> SimpleNamespace:
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


def prefill_info_fields(case: TransferCase) -> dict[str, Any]:
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


def layer_ids(layout: StageLayout, num_layers: int, pp_rank: int) -> list[int]:
    """Global ids of the layers PP rank ``pp_rank`` holds [LAYER-1, LAYER-2]."""
    return list(layer_ranges(layout, num_layers)[pp_rank])


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


class SglangAdapter(Adapter):
    """SGLang's disaggregation mapping (``sglang``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    policies = ()  # every prefill rank of a window sends, replicas included [PLAN-4]
    slicing_modes = ("sender",)  # the prefill side always cuts

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

    def supports(self, case: TransferCase) -> bool:
        return pp_pair_supported(case)

    def _rank_mapping(self, case: TransferCase, dst: int) -> Any:
        info = self.conn.PrefillServerInfo(**prefill_info_fields(case))
        self.conn.CommonKVManager._resolve_rank_mapping(decode_manager(case, dst), info)
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
            # required_prefill_response_num responses never arrive: the request fails.
            raise RuntimeError(f"decode rank {dst} still waits for prefill ranks {missing}")
        dst_pp = stage_coords(dst, case.target.tp)[0]
        dst_layers = layer_ids(case.target, case.model.num_layers, dst_pp)
        heads = (
            1
            if case.model.attention == "mla"
            else max(1, case.model.num_kv_heads // case.target.tp)
        )
        first = shipments[0].kv.data
        out = torch.zeros(
            (len(dst_layers), first.shape[1], first.shape[2], heads, first.shape[4]),
            dtype=first.dtype,
            device=first.device,
        )
        for src in expected:
            s = by_source[src]
            kv = s.kv if s.marker.applied else self._cut(case, src, dst, s.kv)
            _, count, dst_head = self._heads(case, src, dst)
            count = count or kv.data.shape[3]
            for (src_kv, src_layer), (dst_kv, dst_layer) in self._writes(case, src, dst_layers):
                if src_layer not in s.edge.layers:
                    continue  # not in this shipment (kvspec ships only shared layers)
                row = kv.data[s.edge.layers.index(src_layer), src_kv]
                out[dst_layers.index(dst_layer), dst_kv, :, dst_head : dst_head + count] = row
        return RequestKV(out)

    def _writes(self, case: TransferCase, src: int, dst_layers: list[int]) -> list:
        """Where each prefill layer buffer of ``src``'s stage is written on the decode side:
        ``get_mha_kv_ptrs_with_pp`` (MHA) or ``get_mla_kv_ptrs_with_pp`` (MLA), called with
        layer ids in place of addresses."""
        pp_rank = stage_coords(src, case.source.tp)[0]
        src_layers = layer_ids(case.source, case.model.num_layers, pp_rank)
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
    def validate_topology(self, config: dict[str, Any]) -> None:
        case = SimpleNamespace(
            source=SimpleNamespace(**{"pp": 1, **config["source"]}),
            target=SimpleNamespace(**{"pp": 1, **config["target"]}),
            model=SimpleNamespace(attention=config["model"].get("attention", "mha")),
        )
        rank = config.get("rank", {})
        dst = rank.get("rank", 0) if rank.get("side") == "target" else 0
        info = self.conn.PrefillServerInfo(**prefill_info_fields(case))  # type: ignore[arg-type]
        self.conn.CommonKVManager._resolve_rank_mapping(decode_manager(case, dst), info)  # type: ignore[arg-type]

    def validate_partition(self, config: dict[str, Any]) -> None:
        for side in ("source", "target"):
            layout = config[side]
            pp, partition = layout.get("pp", 1), layout.get("layer_partition")
            with _environment(PARTITION_VARIABLE, partition_setting(partition)):
                for pp_rank in range(pp):
                    self.utils.get_pp_indices(config["model"]["num_layers"], pp_rank, pp)


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
