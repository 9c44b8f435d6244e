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

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from kvspec.adapters._engine import (
    import_engine,
    invert_sources,
    stage_coords,
    stand_in_if_unusable,
)
from kvspec.conformance.adapter import Adapter
from kvspec.dtypes import FP8_DTYPES
from kvspec.kv import RequestKV
from kvspec.ownership import layer_ranges
from kvspec.reshard import Shipment
from kvspec.stage import StageLayout
from kvspec.strategies import TransferCase

NAME = "sglang"
INSTALL = "sglang 0.5.23 (field/requirements/sglang.txt)"
V_OFFSET = 1 << 20
"""Layer ids stand for buffer addresses in ``get_mha_kv_ptrs_with_pp``: K of layer l is
``l``, V is ``V_OFFSET + l``."""


# -- translation: kvspec <-> SGLang (pure) -------------------------------------------------


def in_domain(case: TransferCase) -> bool:
    """SGLang's domain: what it refuses on purpose is outside.

    - decode PP other than 1 or the prefill's PP: ``assert self.pp_size == info.pp_size
      or self.pp_size == 1`` in ``_resolve_rank_mapping``;
    - fp8: kvspec's fp8 KV carries per-layer scales [DTYPE-3]; SGLang transfers KV pages
      only (scales are per-server config; #20705).
    """
    return case.target.pp in (1, case.source.pp) and case.model.dtype not in FP8_DTYPES


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


def layer_pointers(layers: Sequence[int]) -> list[int]:
    """Stand-in buffer addresses, ``[K of each layer..., V of each layer...]`` as SGLang
    lists its per-layer K and V buffers."""
    return [*layers, *(V_OFFSET + layer for layer in layers)]


def paired_layers(pairs: tuple[list[int], list[int], list[int], list[int], int]) -> list:
    """``(prefill layer, decode layer)`` from ``get_mha_kv_ptrs_with_pp``'s K pointer
    lists, as far as both reach."""
    src_k, _, dst_k, _, _ = pairs
    return list(zip(src_k, dst_k, strict=False))


# -- the adapter ---------------------------------------------------------------------------


class SglangAdapter(Adapter):
    """SGLang's disaggregation mapping (``sglang``) through kvspec; see the module docstring."""

    name = NAME
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
        import sglang

        self.version = f"sglang {sglang.__version__}"

    def supports(self, case: TransferCase) -> bool:
        return in_domain(case)

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
            for src_layer, dst_layer in self._layer_pairs(case, src, dst_layers):
                if src_layer not in s.edge.layers:
                    continue  # not in this shipment (kvspec ships only shared layers)
                row = kv.data[s.edge.layers.index(src_layer)]
                out[dst_layers.index(dst_layer), :, :, dst_head : dst_head + count] = row
        return RequestKV(out)

    def _layer_pairs(
        self, case: TransferCase, src: int, dst_layers: list[int]
    ) -> list[tuple[int, int]]:
        src_layers = layer_ids(
            case.source, case.model.num_layers, stage_coords(src, case.source.tp)[0]
        )
        manager = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=src_layers[0]))
        pairs = self.conn.CommonKVManager.get_mha_kv_ptrs_with_pp(
            manager, layer_pointers(src_layers), layer_pointers(dst_layers)
        )
        return paired_layers(pairs)

    # rejection [PLAN-1] ----------------------------------------------------------------------
    def validate(self, config: dict[str, Any]) -> None:
        case = SimpleNamespace(
            source=SimpleNamespace(**{"pp": 1, **config["source"]}),
            target=SimpleNamespace(**{"pp": 1, **config["target"]}),
            model=SimpleNamespace(attention=config["model"].get("attention", "mha")),
        )
        rank = config.get("rank", {})
        dst = rank.get("rank", 0) if rank.get("side") == "target" else 0
        info = self.conn.PrefillServerInfo(**prefill_info_fields(case))  # type: ignore[arg-type]
        self.conn.CommonKVManager._resolve_rank_mapping(decode_manager(case, dst), info)  # type: ignore[arg-type]
