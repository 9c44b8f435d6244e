"""vLLM's canonical page mapping for KV offloading, through kvspec:
``kvspec conform vllm-canonical``.

Checks the installed ``vllm`` package (pinned in field/requirements/vllm-canonical.txt;
vllm 0.33.0), nothing copied: ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/
canonical_mapping.py`` is "the only place in the offloading stack that reasons about
parallelism (TP/DCP/PCP)". For one layer and one rank of the ``TP x PCP`` grid,
``_layer_mapping`` gives the runs that place the rank's page into the *canonical* page —
the whole block without parallelism: every KV head, ``block_size * dcp * pcp`` tokens,
CP-interleaved (``_local_to_canonical_token``: local token ``i`` of a rank lands at
``(i // I * cp + cp_rank) * I + i % I``, ``I = cp_kv_cache_interleave_size``,
``cp_rank = pcp_rank * dcp + tp_rank % dcp``), and ``_verify_tiling`` asserts that
whichever ranks write a block tile its canonical page exactly once. Both run as
``derive_canonical_mappings`` runs them, for every rank; the adapter reads what each rank
holds back from the canonical byte offsets of its runs, in the page encoding the mapping
keeps (``LBHNC``: ``[H, block_size * cp, 2 * head_size]``; MLA ``[block_size * cp,
latent]``), and answers kvspec's ownership questions with it:

- :meth:`VllmCanonicalAdapter.owned`: the heads a rank's runs fill (every layer: the
  mapping is per layer and the offload group is one pipeline stage,
  ``world_size == tp * pcp``);
- :meth:`VllmCanonicalAdapter.owned_tokens`: the request's tokens a rank's runs fill,
  block by block — against kvspec's ``interleave:I`` rule [CP-1] and its DCP sharing
  [CP-3].

The engine's contract: vLLM's rule is ``interleave:I`` (``cp_kv_cache_interleave_size``);
a layer it cannot certify gets the opaque fallback (each rank's page whole at its own
offset), which says nothing about ownership: the adapter refuses such a layout
(``ValueError``) rather than read heads or tokens from it. vLLM's start-up refuses DCP for
GQA unless ``tp > kv_heads`` and ``dcp <= tp // kv_heads`` (vllm/config/model.py), and
with PCP > 1 a DCP other than 1, PCP or TP x PCP (vllm/config/parallel.py).

Domain: PP 1; TP sizes and head counts of powers of two, so a head's replicas are a
multiple of DCP (``replication % dcp``, else the fallback); ``interleave`` only; no
fp8 (per-token-head quantized KV is not certified).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from kvspec.adapters._engine import import_engine
from kvspec.adapters._vllm import vllm_version
from kvspec.conformance.adapter import Adapter, AdapterError
from kvspec.conformance.adapter.protocols import OwnershipProtocol, TokensProtocol
from kvspec.conformance.domain import Domain
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from kvspec.topology.tokens import Tokens

NAME = "vllm-canonical"
INSTALL = "vllm 0.33.0 (field/requirements/vllm-canonical.txt)"
MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping"
HEAD_SIZE = 1
"""The head size of the pages the mapping is asked about: ownership does not depend on
it, and the smallest keeps every byte walk short."""

DOMAIN = Domain(
    tp_sizes=(1, 2, 4, 8),
    pp_sizes=(1,),
    explicit_partitions=False,
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    cp_sizes=(1, 2),
    dcp_sizes=(1, 2, 4),
    cp_rules=("interleave",),
)
"""The canonical mapping's domain as data [CP-1, CP-3]; see the module docstring."""


def _powers_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def canonical_cells(
    runs: Sequence[Any], cell_bytes: int, span: int, mla: bool
) -> list[tuple[int, int]]:
    """The (head, token within the block) cells a rank's runs fill in the canonical page:
    ``[H, span, cell]`` (``LBHNC``, the HND branch of ``_packed_kv_regions``) or MLA's
    ``[span, cell]``, ``cell_bytes`` the bytes of one (head, token)."""
    cells = []
    for run in runs:
        for i in range(run.num_fragments):
            start = run.canonical_offset + i * run.canonical_stride
            for byte in range(start, start + run.fragment_size, cell_bytes):
                head, token = divmod(byte // cell_bytes, span)
                cells.append((0, byte // cell_bytes) if mla else (head, token))
    return cells


class VllmCanonicalAdapter(Adapter, OwnershipProtocol, TokensProtocol):
    """vLLM's canonical offloading map (``vllm``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    refusal_types = (ValueError, AssertionError)

    def __init__(self) -> None:
        self.version = vllm_version(NAME, INSTALL)
        self.mapping = import_engine(MODULE, adapter=NAME, install=INSTALL)
        self.specs = import_engine("vllm.v1.kv_cache_interface", adapter=NAME, install=INSTALL)
        missing = [
            f
            for f in ("_RankContext", "_layer_mapping", "_verify_tiling")
            if not hasattr(self.mapping, f)
        ]
        if missing:
            raise AdapterError(
                f"the {NAME!r} adapter runs vLLM's canonical offloading map; {self.version}'s "
                f"{MODULE} has no {', '.join(missing)}"
            )

    # engine calls ------------------------------------------------------------------------
    def _block_size(self, layout: StageLayout) -> int:
        """The block size of the pages asked about: twice the interleave (vLLM needs a
        multiple of it). Not one token: a one-token block of one head has the strides of
        both stride orders, and ``_packed_kv_regions`` then encodes it NHD."""
        return 2 * (layout.rule.size if layout.token_shards > 1 else 1)

    @functools.lru_cache(maxsize=256)  # noqa: B019  (the adapter lives for one run)
    def _mappings(self, layout: StageLayout, model: ModelShape) -> tuple[Any, ...]:
        """Every rank's ``CanonicalPageMapping`` of one layer, as
        ``derive_canonical_mappings`` builds and verifies them (ranks ``pcp_rank * tp +
        tp_rank``: kvspec's ``cp_rank * attn_tp + attn_tp_rank``)."""
        if layout.dp > 1 or layout.pp > 1:
            raise ValueError(
                f"{layout.describe()}: vLLM's canonical map is for one offload group, "
                "world_size == tp * pcp (no attention DP, no PP)"
            )
        if layout.token_shards > 1 and layout.rule.kind != "interleave":
            raise ValueError(
                f"vLLM places CP tokens by cp_kv_cache_interleave_size only; "
                f"{layout.cp_rule!r} is not a vLLM setting"
            )
        tp, mla = layout.attn_tp, model.attention == "mla"
        bs = self._block_size(layout)
        heads = 1 if mla else max(1, model.num_kv_heads // tp)
        dtype = DTYPES[model.dtype]
        if mla:
            spec = self.specs.MLAAttentionSpec(
                block_size=bs, num_kv_heads=1, head_size=HEAD_SIZE, dtype=dtype
            )
            cache = None
        else:
            spec = self.specs.FullAttentionSpec(
                block_size=bs, num_kv_heads=heads, head_size=HEAD_SIZE, dtype=dtype
            )
            # vLLM's per-layer view under LBHNC: [B, H, N, 2 * head_size], dense
            cache = torch.empty(1, heads, bs, 2 * HEAD_SIZE, dtype=dtype)
        out = []
        for rank in range(layout.tp):
            ctx = self.mapping._RankContext(
                tp_size=tp,
                dcp_size=layout.dcp,
                pcp_size=layout.cp,
                interleave=layout.rule.size if layout.token_shards > 1 else 1,
                total_kv_heads=model.num_kv_heads,
                rank=rank,
            )
            mapping = self.mapping._layer_mapping(spec, cache, 1, ctx)
            if mapping is None:
                raise ValueError(
                    f"{layout.describe()}, {model.describe()}: vLLM cannot certify a canonical "
                    f"page for rank {rank} (_layer_mapping returns None) and falls back to "
                    "its opaque per-rank page, which holds no ownership"
                )
            out.append(mapping)
        self.mapping._verify_tiling("model.layers.0.self_attn.attn", out)
        return tuple(out)

    def _cells(self, layout: StageLayout, model: ModelShape, rank: int) -> list[tuple[int, int]]:
        mapping = self._mappings(layout, model)[rank]
        mla = model.attention == "mla"
        span = self._block_size(layout) * layout.token_shards
        itemsize = DTYPES[model.dtype].itemsize
        cell = (1 if mla else 2) * HEAD_SIZE * itemsize
        return canonical_cells(mapping.runs, cell, span, mla)

    # ownership [STAGE-1, HEAD-1..3, STAGE-2] ----------------------------------------------
    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        heads = sorted({head for head, _ in self._cells(layout, model, rank)})
        if heads != list(range(heads[0], heads[-1] + 1)):
            raise ValueError(f"rank {rank}'s canonical heads {heads} are not one run")
        return range(heads[0], heads[-1] + 1), range(model.num_layers)

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        """The request's tokens rank ``rank`` holds: block ``b`` of the request is canonical
        block ``b``, ``block_size * cp`` tokens, and the rank fills the cells its runs
        reach in it [CP-1, CP-3]."""
        span = self._block_size(layout) * layout.token_shards
        in_block = sorted({token for _, token in self._cells(layout, model, rank)})
        held = [
            range(t, t + 1)
            for start in range(0, seq_len, span)
            for t in (start + u for u in in_block)
            if t < seq_len
        ]
        return Tokens.of(held).ranges
