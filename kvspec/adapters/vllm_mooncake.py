"""vLLM's Mooncake connector sender plan, through kvspec: ``kvspec conform vllm-mooncake``.

Checks the installed ``vllm`` package (pinned in field/requirements/vllm-mooncake.txt;
vllm 0.33.0), nothing copied, all read in that wheel:

- ``vllm/distributed/kv_transfer/kv_connector/utils.py`` ``TransferTopology``:
  ``handshake_target_ranks`` pairs the two sides (a decode rank pulls from those prefill
  ranks, ``MooncakeConnectorWorker.receive_kv``; a prefill rank answers only the decode
  ranks of its own list, ``send_kv_to_decode``), ``local_replicates_kv_cache`` says
  whether a prefill rank's heads are replicas (MLA, or TP above the KV heads);
- ``.../v1/mooncake/mooncake_connector.py`` ``_compute_sender_transfer_plan``: for one
  (prefill rank, decode rank) pair, whether the prefill rank writes, the byte offsets in
  both blocks and the length; it carries the vllm#52516 fix (TP8 prefill -> TP1 decode
  with 4 KV heads: before it only rank 0 wrote, and the decode marked its KV ready);
  ``_expand_transfer_regions`` / ``_align_transfer_regions`` /
  ``_validate_asymmetric_region_lengths`` build, pair by layer name, and check the
  registered regions; ``MooncakeConnectorWorker._build_transfer_params`` turns the plan
  and a request's block ids into the (src, dst, length) list handed to
  ``batch_transfer_sync_write`` — run on a bare worker holding only the attributes it
  reads, with kvspec's registered caches as the regions (:meth:`descriptors`).

Mooncake pushes: the prefill rank ("local") writes into the decode rank's ("remote")
blocks, which the decode announced. vLLM requests the ``LBHNC`` layout for it
(``MooncakeConnector.get_required_kvcache_layout``; MLA keeps the default), so one
layer's block is ``[H, N, 2 * head_size]`` (kvspec's ``vllm_packed_hnd``) and a byte
offset within a block is a head offset: ``heads * N * 2 * head_size * itemsize``. The
adapter turns the plan's bytes into heads at exactly that rate and refuses a plan that
cuts a head. A decode head no prefill rank writes keeps whatever the decode's block
held: the decode marks the request ready once every paired prefill rank answered
(``send_meta.sent == send_meta.need_send``), written or not.

The engine's contract, read in the installed 0.33.0 package:

- replica rule: the first replica of a head in the decode rank's window writes it
  (kvspec/topology/field_policies.py ``vllm_mooncake_write``; ``replicas_write = "one"``);
- refusals: ``assert`` (``_get_tp_ratio``, ``TransferTopology.tp_ratio``: TP sizes that
  do not divide; the head checks of vLLM's start-up), ``RuntimeError`` (a pair the
  prefill answers with an ERROR response: not paired, or region lengths that do not
  match the TP ratio — the decode fails those requests);
- inputs serving never produces: :data:`SERVING_NEVER_PRODUCES`;
- start-up validation (:meth:`VllmMooncakeAdapter.serving_accepts`): vLLM's head checks
  on each side, then the decode's pairing and the prefill's region check for every pair.

Older releases (the historical corpus, field/history/): the engine functions are called
by keyword with only the keywords the installed release takes (``_vllm.call_accepting``),
so a release before ``total_num_kv_heads`` (vllm#52516) runs its own plan; what an older
release lacks is refused when the adapter is created, naming it.

Domain: PP 1 (Mooncake pairs pipeline stages by layer name, ``_align_transfer_regions``;
not adapted yet), no fp8 (the connector registers the cache pages only, no scales),
block size 1 for the descriptor checks: Mooncake copies whole blocks, a request's
range starts at a block boundary in serving (prefix caching is block-granular) and the
slots past the prompt in its last block are written by the decode before they are read,
while DESC-1 judges slot by slot; with one token a block the two agree, and the offsets
scale with the block size and do not otherwise depend on it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import Any, NamedTuple

import torch

from kvspec.adapters._engine import engine_message, import_engine, invert_sources
from kvspec.adapters._vllm import (
    bare_instance,
    both_sides_head_checks,
    call_accepting,
    parameters,
    vllm_version,
)
from kvspec.conformance.adapter import Acceptance, Adapter, AdapterError, NotProvided
from kvspec.conformance.adapter.protocols import (
    DescriptorsProtocol,
    ReceiverProtocol,
    RoutingProtocol,
    SenderProtocol,
    TopologyProtocol,
)
from kvspec.conformance.domain import Domain
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.memory.descriptors import Descriptor, RegisteredCache
from kvspec.tensors.dtypes import DTYPES, FP8_DTYPES
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import VLLM_MOONCAKE, vllm_mooncake_write
from kvspec.topology.model import ModelShape

NAME = "vllm-mooncake"
INSTALL = "vllm 0.33.0 (field/requirements/vllm-mooncake.txt)"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
UTILS = "vllm.distributed.kv_transfer.kv_connector.utils"
BLOCK_SIZE = 16
"""Tokens per block of the caches whose byte lengths the plan is asked about (any size
gives the same plan in heads: offsets are multiples of one head's bytes)."""
_BASE = 1 << 40
"""Region ``i`` of a rank is given the address ``(i + 1) * _BASE``, so an address the
engine computes names its region and offset."""

# -- translation: kvspec <-> vLLM (pure) ---------------------------------------------------

DOMAIN = Domain(
    pp_sizes=(1,),
    explicit_partitions=False,
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    layouts=("vllm_packed_hnd", "vllm_mla"),
    block_sizes=(1,),
    repeated_deliveries=False,
)
"""vLLM Mooncake's domain as data [PLAN-1]; see the module docstring for what is out."""

SERVING_NEVER_PRODUCES: Mapping[str, str] = MappingProxyType(
    {
        "DESC-2.2": (
            "a registered region shorter than the request's block ids need: "
            "MooncakeConnectorWorker.register_kv_caches registers each KV storage whole "
            "(batch_register_memory(kv_data_ptrs, storage.nbytes())), and block ids come "
            "from vLLM's block pool, below kv_cache_config.num_blocks "
            "(mooncake_connector.py, vllm 0.33.0)"
        ),
        "RESHARD-3.2": (
            "a write from a prefill rank the decode's plan does not list: a prefill rank "
            "writes only into the blocks a decode rank announced to it, and a decode rank "
            "announces them only to TransferTopology.handshake_target_ranks "
            "(MooncakeConnectorWorker.receive_kv, vllm 0.33.0)"
        ),
    }
)


class HeadCopy(NamedTuple):
    """One planned write in heads: ``heads`` heads from local head ``src`` of the prefill
    rank's block to local head ``dst`` of the decode rank's block."""

    src: int
    dst: int
    heads: int


def local_heads(model: ModelShape, tp: int) -> int:
    """Heads one rank holds: ``TransferTopology.local_physical_heads`` =
    ``max(1, total_num_kv_heads // tp_size)``; an MLA latent is one."""
    return 1 if model.attention == "mla" else max(1, model.num_kv_heads // tp)


def head_bytes(model: ModelShape, block_size: int = BLOCK_SIZE) -> int:
    """Bytes of one head in one ``LBHNC`` block ``[H, N, 2 * head_size]`` (MLA:
    ``[1, N, latent]``): ``AttentionSpec.state_content_size_bytes`` per token."""
    itemsize = DTYPES[model.dtype].itemsize
    return block_size * model.kv_tensors * model.head_dim * itemsize


def heads_of(plan: Sequence[Any], unit: int) -> HeadCopy | None:
    """The plan ``(should_transfer, src_offset, dst_offset, length)`` in heads of ``unit``
    bytes, or None when the rank does not write. A plan that cuts a head is refused."""
    should, src, dst, length = plan
    if not should:
        return None
    if src % unit or dst % unit or length % unit or length <= 0:
        raise RuntimeError(
            f"vLLM's Mooncake plan {tuple(plan)} cuts a head of {unit} bytes: it cannot be "
            "a copy of whole heads"
        )
    return HeadCopy(src // unit, dst // unit, length // unit)


def place_writes(
    writes: Sequence[tuple[RequestKV, int]], *, heads: int, like: RequestKV
) -> RequestKV:
    """The decode block after the writes, each ``(kv, first local head)``, in order: a
    later write over an earlier one wins, a head no write reaches keeps the block's old
    bytes (zeros here), as an RDMA write leaves them [RESHARD-2]."""
    shape = list(like.data.shape)
    shape[3] = heads
    out = torch.zeros(shape, dtype=like.data.dtype, device=like.data.device)
    for kv, first in writes:
        n = kv.data.shape[3]
        if first + n > heads:
            raise RuntimeError(f"a write of {n} head(s) at head {first} runs past {heads} head(s)")
        out[:, :, :, first : first + n] = kv.data
    return RequestKV(out)


def layer_name(layer: int) -> str:
    """vLLM's attention layer name, whose index ``extract_layer_index`` reads."""
    return f"model.layers.{layer}.self_attn.attn"


def region_plan(cache: RegisteredCache, first_layer: int) -> dict[str, list[Any]]:
    """The registration ``register_kv_caches`` makes for a cache of one tensor per layer,
    block-contiguous (``LBHNC``, MLA's default): one region per layer whose block length
    and KV block length are one block's bytes (``page_size_bytes``); as keyword lists for
    ``_expand_transfer_regions``."""
    if cache.spec.tuple_form or cache.spec.cross_layer:
        raise ValueError(
            f"vLLM's Mooncake connector registers one block-contiguous tensor per layer; a "
            f"{cache.layout.name} cache is not one [DESC-1]"
        )
    names = list(cache.regions())
    block = cache.tensor_bytes() // cache.num_blocks
    return {
        "base_addrs": [(i + 1) * _BASE for i in range(len(names))],
        "block_lens": [block] * len(names),
        "kv_block_lens": [block] * len(names),
        "layer_names": [layer_name(first_layer + i) for i in range(len(names))],
        "layer_indices": [first_layer + i for i in range(len(names))],
    }


def descriptors_of(
    ptrs: tuple[Sequence[int], Sequence[int], Sequence[int]],
    source: RegisteredCache,
    target: RegisteredCache,
) -> list[Descriptor]:
    """The engine's (src address, dst address, length) lists as kvspec descriptors."""
    src_names, dst_names = list(source.regions()), list(target.regions())
    out = []
    for src, dst, length in zip(*ptrs, strict=True):
        (si, so), (di, do) = divmod(src, _BASE), divmod(dst, _BASE)
        out.append(Descriptor(src_names[si - 1], so, dst_names[di - 1], do, length))
    return out


# -- the adapter ---------------------------------------------------------------------------


class VllmMooncakeAdapter(
    Adapter,
    RoutingProtocol,
    TopologyProtocol,
    SenderProtocol,
    ReceiverProtocol,
    DescriptorsProtocol,
):
    """vLLM's Mooncake write plan (``vllm``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    policies = (VLLM_MOONCAKE,)
    policy_rules = MappingProxyType({VLLM_MOONCAKE: vllm_mooncake_write})
    slicing_modes = ("sender",)  # a write copies exactly its byte range
    refusal_types = (AssertionError, ValueError, RuntimeError)
    serving_never_produces = SERVING_NEVER_PRODUCES

    def __init__(self) -> None:
        self.conn = import_engine(CONNECTOR, adapter=NAME, install=INSTALL)
        self.utils = import_engine(UTILS, adapter=NAME, install=INSTALL)
        self.version = vllm_version(NAME, INSTALL)
        missing = [
            name
            for name in ("_compute_sender_transfer_plan", "_expand_transfer_regions")
            if not hasattr(self.conn, name)
        ]
        if missing or not hasattr(self.utils.TransferTopology, "handshake_target_ranks"):
            raise AdapterError(
                f"the {NAME!r} adapter calls vLLM's Mooncake sender plan; {self.version} "
                f"has no {', '.join(missing) or 'TransferTopology.handshake_target_ranks'} "
                f"({CONNECTOR})"
            )

    def supports(self, case: TransferCase) -> bool:
        return True

    # engine calls ------------------------------------------------------------------------
    def _topology(self, tp: int, rank: int, model: ModelShape) -> Any:
        return call_accepting(
            self.utils.TransferTopology,
            tp_rank=rank,
            tp_size=tp,
            block_size=BLOCK_SIZE,
            engine_id=f"tp{tp}",
            is_mla=model.attention == "mla",
            is_mamba=False,
            total_num_kv_heads=model.num_kv_heads,
            attn_backends=[],
        )

    def _replicated(self, topology: Any) -> bool:
        """``MooncakeConnectorWorker._producer_cache_is_replicated``: the topology's
        ``local_replicates_kv_cache``."""
        replicated = getattr(topology, "local_replicates_kv_cache", None)
        if replicated is None:
            raise AdapterError(
                f"{self.version}: TransferTopology has no local_replicates_kv_cache, which "
                "the adapter reads for the prefill's replication"
            )
        return bool(replicated)

    def _plan(self, model: ModelShape, p: int, tp_p: int, d: int, tp_d: int) -> Any:
        """``_compute_sender_transfer_plan`` for prefill rank ``p`` writing decode rank ``d``,
        as ``MooncakeConnectorWorker._get_sender_transfer_plan`` calls it."""
        unit = head_bytes(model)
        mla = model.attention == "mla"
        return call_accepting(
            self.conn._compute_sender_transfer_plan,
            local_tp_rank=p,
            local_tp_size=tp_p,
            remote_tp_rank=d,
            remote_tp_size=tp_d,
            local_kv_block_len=local_heads(model, tp_p) * unit,
            remote_kv_block_len=local_heads(model, tp_d) * unit,
            producer_cache_replicated=self._replicated(self._topology(tp_p, p, model)),
            total_num_kv_heads=None if mla else model.num_kv_heads,
        )

    def _answer(self, model: ModelShape, p: int, tp_p: int, d: int, tp_d: int) -> None:
        """What prefill rank ``p``'s ``send_kv_to_decode`` checks before it writes for
        decode rank ``d``: the pairing, then ``_validate_asymmetric_region_lengths``; an
        ERROR response fails the decode's requests (raised as RuntimeError)."""
        paired = self._topology(tp_p, p, model).handshake_target_ranks(tp_d)
        if d not in paired:
            raise RuntimeError(
                f"prefill TP rank {p} answers decode TP rank {d} with an ERROR: not paired, "
                f"expected one of {paired} (send_kv_to_decode)"
            )
        validate = getattr(self.conn, "_validate_asymmetric_region_lengths", None)
        if validate is None:
            return
        unit = head_bytes(model)
        regions = [
            self._regions([local_heads(model, tp) * unit], [layer_name(0)]) for tp in (tp_p, tp_d)
        ]
        mla = model.attention == "mla"
        error = call_accepting(
            validate,
            local_regions=regions[0],
            remote_regions=regions[1],
            local_tp_size=tp_p,
            remote_tp_size=tp_d,
            producer_cache_replicated=self._replicated(self._topology(tp_p, p, model)),
            total_num_kv_heads=None if mla else model.num_kv_heads,
        )
        if error is not None:
            raise RuntimeError(
                f"prefill TP rank {p} answers decode TP rank {d} with an ERROR: {error}"
            )

    def _regions(self, block_lens: list[int], names: list[str]) -> list[Any]:
        return call_accepting(
            self.conn._expand_transfer_regions,
            base_addrs=[(i + 1) * _BASE for i in range(len(names))],
            block_lens=block_lens,
            kv_block_lens=block_lens,
            layer_names=names,
            layer_indices=list(range(len(names))),
        )

    @functools.lru_cache(maxsize=512)  # noqa: B019  (the adapter lives for one run)
    def _writers(self, model: ModelShape, tp_p: int, tp_d: int, d: int) -> tuple[Any, ...]:
        """Decode rank ``d``'s paired prefill ranks with their plans, in pairing order."""
        paired = self._topology(tp_d, d, model).handshake_target_ranks(tp_p)
        out = []
        for p in paired:
            self._answer(model, p, tp_p, d, tp_d)
            out.append((p, self._plan(model, p, tp_p, d, tp_d)))
        return tuple(out)

    def _copies(self, case: TransferCase, d: int) -> dict[int, HeadCopy]:
        if case.policy != VLLM_MOONCAKE:
            raise ValueError(
                f"vLLM Mooncake has one replica rule, {VLLM_MOONCAKE!r} "
                f"(_compute_sender_transfer_plan); policy {case.policy!r} cannot be configured "
                "[PLAN-4.4]"
            )
        unit = head_bytes(case.model)
        out = {}
        for p, plan in self._writers(case.model, case.source.tp, case.target.tp, d):
            copy = heads_of(plan, unit)
            if copy is not None:
                out[p] = copy
        return out

    # routing [PLAN-2, PLAN-3] ------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        return sorted(self._copies(case, dst))

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        writers = {dst: self.sources(case, dst) for dst in case.target.ranks()}
        return invert_sources(writers, case.source.ranks())[src]

    # what a write copies, where it lands [SLICE-1, RESHARD-2] -----------------------------
    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        return {dst: self._cut(case, src, dst, shard) for dst in self.targets(case, src)}

    def _cut(self, case: TransferCase, src: int, dst: int, shard: RequestKV) -> RequestKV:
        copy = self._copies(case, dst)[src]
        if copy.src + copy.heads > shard.data.shape[3]:
            raise RuntimeError(
                f"prefill rank {src}'s write of heads {copy.src}..{copy.src + copy.heads - 1} "
                f"runs past its {shard.data.shape[3]} head(s)"
            )
        return shard.head_slice(copy.src, copy.src + copy.heads)

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        copies = self._copies(case, dst)
        by_source = {s.edge.src: s for s in shipments}
        missing = [src for src in copies if src not in by_source]
        if missing:
            # the transfer engine returned an error: the decode fails the request
            raise RuntimeError(f"decode rank {dst}: no write from prefill rank(s) {missing}")
        writes = []
        for src, copy in copies.items():
            s = by_source[src]
            kv = s.kv if s.marker.applied else self._cut(case, src, dst, s.kv)
            writes.append((kv, copy.dst))
        like = shipments[0].kv if shipments else RequestKV(torch.zeros(0, 1, 0, 0, 1))
        return place_writes(writes, heads=local_heads(case.model, case.target.tp), like=like)

    # the byte ranges Mooncake posts [DESC-1, DESC-2] -------------------------------------
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
        """``MooncakeConnectorWorker._build_transfer_params`` for one request, on a bare
        worker of prefill rank ``src`` with the attributes it reads, over the regions
        ``_expand_transfer_regions`` / ``_align_transfer_regions`` build from kvspec's
        registered caches. The decode announces the blocks it loads (from the range's
        first block on); the prefill offers all of the request's, and the engine keeps
        the last as many. An error the engine reports fails the request (RuntimeError)."""
        build = getattr(self.conn.MooncakeConnectorWorker, "_build_transfer_params", None)
        align = getattr(self.conn, "_align_transfer_regions", None)
        wanted = {"ready_reqs", "agent_meta", "local_regions", "remote_regions"}
        if build is None or align is None or not wanted <= parameters(build):
            raise NotProvided(
                f"{self.version} builds its transfer lists differently from vllm 0.33.0's "
                "_build_transfer_params(ready_reqs, agent_meta, local_regions, remote_regions)"
            )
        model, tp_p, tp_d = case.model, case.source.tp, case.target.tp
        self._answer(model, src, tp_p, dst, tp_d)
        local = call_accepting(self.conn._expand_transfer_regions, **region_plan(source, 0))
        remote = call_accepting(self.conn._expand_transfer_regions, **region_plan(target, 0))
        local, remote, error = align(local, remote)
        if error is not None:
            raise RuntimeError(f"prefill rank {src} refuses decode rank {dst}: {error}")
        worker = self._bare_worker(model, src, tp_p)
        first = tokens.start // target.block_size
        meta = SimpleNamespace(
            req_blocks={"req": ("transfer", [list(target_ids[first:])])},
            remote_tp_rank=dst,
            remote_tp_size=tp_d,
            remote_hostname="decode",
            remote_port=0,
        )
        ready = [("req", SimpleNamespace(local_block_ids=[list(source_ids)]))]
        src_ptrs, dst_ptrs, lengths, failed, message = asyncio.run(
            build(worker, ready, meta, local, remote)
        )
        if failed:
            raise RuntimeError(f"prefill rank {src} fails the request: {message}")
        return descriptors_of((src_ptrs, dst_ptrs, lengths), source, target)

    def _bare_worker(self, model: ModelShape, rank: int, tp: int) -> Any:
        """A ``MooncakeConnectorWorker`` holding only what ``_build_transfer_params``
        reads: its rank, the topology, MLA, one attention KV group, no kernel-block split."""
        worker = bare_instance(self.conn.MooncakeConnectorWorker)
        worker.tp_rank, worker.tp_size = rank, tp
        worker.use_mla = model.attention == "mla"
        worker.transfer_topo = self._topology(tp, rank, model)
        worker.kv_cache_config = SimpleNamespace(
            transfer_groups=[SimpleNamespace(kv_cache_spec="attention")],
            has_mamba_layers=False,
        )
        worker._physical_blocks_per_logical_kv_block = 1
        return worker

    # refusals: the pair of stages [PLAN-1] -------------------------------------------------
    def validate_topology(self, config: TransferConfig) -> None:
        model = ModelShape.from_dict(config["model"])
        tp_p, tp_d = int(config["source"]["tp"]), int(config["target"]["tp"])
        for d in range(tp_d):
            self._writers(model, tp_p, tp_d, d)

    # start-up validation [serving reachability] -------------------------------------------
    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        """Whether vLLM runs a Mooncake prefill/decode pair with ``config``, by its own code,
        on CPU: for each side the head checks of ``ModelConfig.verify_with_parallel_config``
        and ``QKVParallelLinear.__init__`` (``_vllm.vllm_head_checks``); then for every
        decode rank its pairing (``handshake_target_ranks``: ``tp_ratio`` asserts that the
        sizes divide) and each paired prefill rank's answer (the pairing and
        ``_validate_asymmetric_region_lengths``, which fail the transfer with an ERROR
        response). Query heads are chosen divisible by both TP sizes (kvspec models only
        KV heads). Not run: a model directory, weights, the transfer engine."""
        try:
            ran = both_sides_head_checks(config, adapter=NAME, install=INSTALL)
            self.validate_topology(config)
            ran.append("every decode rank's pairing and its prefill ranks' region checks")
        except (AssertionError, ValueError, RuntimeError) as error:
            return Acceptance(False, f"{self.version} refuses it: {engine_message(error)}")
        return Acceptance(True, f"{self.version} accepts it ({'; '.join(ran)})")
