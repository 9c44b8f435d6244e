"""vLLM's NIXL connector mapping, through kvspec: ``kvspec conform vllm-nixl``.

Checks the installed ``vllm`` package (pinned in field/requirements/vllm-nixl.txt;
vllm 0.33.0), nothing copied:

- ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py``:
  ``compute_tp_mapping`` says which prefill ranks a decode rank reads, the head slot
  each read lands in (``rank_to_attention_slot``) and the head offset of a read inside
  the remote block (``rank_offset_factor``);
- ``.../kv_connector/utils.py`` ``TransferTopology``: ``tp_ratio`` refuses TP sizes that
  do not divide;
- ``.../v1/nixl/metadata.py`` ``compute_nixl_compatibility_hash``: the handshake refuses
  a peer whose model or cache facts hash differently;
- ``TPMapping.local_consumers`` (0.33.0): how many notifications a prefill rank waits for
  before it frees a request's blocks, checked against the decode ranks that really notify
  it (:meth:`VllmNixlAdapter._check_consumers`). ``compute_tp_mapping``'s other new
  parameters are not covered: ``remote_dcp_size`` (DCP, "scoped to MLA only" with each
  side fully replicated or fully sharded) and ``head_sharded_kv_heads`` (a GQA draft under
  an MLA target) need token-sharded reads and draft groups the adapter does not translate
  yet (docs/engines.md).

NIXL pulls: the decode side ("local") reads slices of the prefill side's ("remote")
blocks. kvspec's sender transform is what a read fetches from one prefill rank, and its
receiver combine is where the reads land; both follow the numbers ``compute_tp_mapping``
returns, read as its docstrings define them. There is no marker and no receiver-side
slicing in a pull [SLICE-3]. The byte arithmetic behind the reads needs a worker with
registered NIXL memory and is not reached (field/NOTES.md).

The engine's contract (issue 28), read in the installed 0.33.0 package:

- replica rule: ``tp_rank * remote_tp_size // tp_size`` for MLA or a decode TP at least
  the prefill's, else the window's first rank per head (``np.unique``): one replica per
  head (kvspec/topology/field_policies.py ``vllm_nixl_read``; ``replicas_write = "one"``);
- refusals: ``assert`` (``TransferTopology.tp_ratio``, ``vllm/distributed/utils.py``
  ``ensure_divisibility``), ``ValueError`` (config checks), ``NotImplementedError`` (decode
  PP > 1), ``RuntimeError`` (the handshake's compatibility hash, base_worker.py);
- start-up validation (:meth:`VllmNixlAdapter.serving_accepts`): the attention-head and
  KV-head checks of ``ModelConfig.verify_with_parallel_config`` and
  ``QKVParallelLinear.__init__`` for each side, and the handshake's ``tp_ratio``.

The functions above the adapter class are pure translation and need no engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

from kvspec.adapters._engine import engine_message, import_engine, invert_sources
from kvspec.adapters._vllm import both_sides_head_checks, kv_heads_of
from kvspec.conformance.adapter import Acceptance, Adapter
from kvspec.conformance.adapter.protocols import (
    AgreementProtocol,
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
from kvspec.topology.case import TransferCase
from kvspec.topology.field_policies import VLLM_NIXL, vllm_nixl_read
from kvspec.topology.model import ModelShape

NAME = "vllm-nixl"
INSTALL = "vllm 0.33.0 (field/requirements/vllm-nixl.txt)"

VLLM_DTYPES: dict[str, tuple[str, str]] = {
    "float32": ("float32", "auto"),
    "float16": ("float16", "auto"),
    "bfloat16": ("bfloat16", "auto"),
    "float8_e4m3fn": ("bfloat16", "fp8_e4m3"),
    "float8_e5m2": ("bfloat16", "fp8_e5m2"),
}
"""kvspec's KV dtype -> vLLM's (model dtype, ``--kv-cache-dtype``); vLLM keeps the model
in a wider dtype and names the fp8 cache separately (vllm/config/cache.py CacheDType)."""


# -- translation: kvspec <-> vLLM (pure) ---------------------------------------------------


DOMAIN = Domain(
    pp_sizes=(1,),
    explicit_partitions=False,
    dtypes=tuple(d for d in DTYPES if d not in FP8_DTYPES),
    repeated_deliveries=False,
)
"""vLLM NIXL's pull domain as data [PLAN-1]; what the engine refuses on purpose is out:

- a repeated delivery: a decode rank reads what it planned, nothing arrives unasked
  [RESHARD-3];

- decode (target) PP > 1: ``NotImplementedError`` in ``base_worker.py`` (consumer PP);
  prefill PP > 1 goes through the push connector, which this adapter does not cover
  (``tp_mapping`` has no layer axis);
- fp8: dynamic scales are not transferred (docs/features/nixl_connector_compatibility.md:
  "dynamic per-block scales ❌"); kvspec's fp8 KV always carries scales [DTYPE-3].
"""


def refuses_replicated_fan_in(case: TransferCase | SimpleNamespace) -> bool:
    """Prefill TP > decode TP with the prefill's heads replicated (TP > KV heads), non-MLA:
    ``assert not (tp_ratio < 0 and is_kv_replicated)`` in
    ``base_worker._validate_remote_agent_handshake`` (what :data:`DOMAIN` cannot say)."""
    model = case.model
    return (
        model.attention != "mla"
        and case.source.tp > case.target.tp
        and case.source.tp > model.num_kv_heads
    )


def local_heads(model: ModelShape, tp: int) -> int:
    """Heads one rank holds: ``TransferTopology.local_physical_heads``'s rule
    ``max(1, total_num_kv_heads // tp_size)``; an MLA latent is one "head"."""
    return 1 if model.attention == "mla" else max(1, model.num_kv_heads // tp)


def read_slice(shard: RequestKV, offset_factor: int, heads: int) -> RequestKV:
    """What one read fetches from a prefill shard: ``heads`` heads at slot ``offset_factor``.

    ``rank_offset_factor`` is "the offset in local head slices within the remote KV
    block" (tp_mapping.py ``compute_head_offset``): the read starts ``offset_factor``
    local-shard widths into the remote block.
    """
    start = offset_factor * heads
    if start + heads > shard.data.shape[3]:
        raise ValueError(
            f"a read of {heads} head(s) at slot {offset_factor} runs past the prefill "
            f"shard's {shard.data.shape[3]} head(s)"
        )
    return shard.head_slice(start, start + heads)


def place_reads(
    reads: Mapping[int, RequestKV], slots: Mapping[int, int], *, heads: int
) -> RequestKV:
    """The decode shard assembled from reads, each at ``heads * slot`` of its source.

    ``rank_to_attention_slot`` "maps each source rank to its FA head slot index"; a read
    of ``n`` heads in slot ``i`` covers local heads ``i*n .. i*n+n-1``. Refuses slots that
    overlap or leave a local head unwritten.
    """
    first = next(iter(reads.values())).data
    shape = list(first.shape)
    shape[3] = heads
    out = torch.empty(shape, dtype=first.dtype, device=first.device)
    written = [0] * heads
    for src, kv in reads.items():
        n = kv.data.shape[3]
        start = slots[src] * n
        if start + n > heads:
            raise ValueError(f"source {src}'s read lands past local head {heads - 1}")
        out[:, :, :, start : start + n] = kv.data
        for h in range(start, start + n):
            written[h] += 1
    if any(w != 1 for w in written):
        raise ValueError(f"reads write local heads {written} times (each must be once)")
    return RequestKV(out)


def vllm_config(model: Mapping[str, Any]) -> Any:
    """The parts of a ``VllmConfig`` that ``compute_nixl_compatibility_hash`` reads.

    ``model`` is the plain-data model of a configuration, taken as given (validating it
    is the engine's business, not the translation's). Only the attributes
    nixl/metadata.py touches are set: the model (name, dtype, KV heads, head size,
    layers), the cache dtype, the hybrid KV manager switch, no speculative decoding.
    A dtype with no vLLM equivalent cannot be configured in vLLM and is refused [DTYPE-1].
    """
    dtype_name = model.get("dtype", "bfloat16")
    if dtype_name not in VLLM_DTYPES:
        raise ValueError(
            f"vLLM has no KV cache dtype for {dtype_name!r} (kvspec -> vLLM: {VLLM_DTYPES})"
        )
    dtype, cache_dtype = VLLM_DTYPES[dtype_name]
    model_config = SimpleNamespace(
        model="kvspec/model",
        dtype=dtype,
        get_total_num_kv_heads=lambda: model.get("num_kv_heads"),
        get_head_size=lambda: model.get("head_dim"),
        get_total_num_hidden_layers=lambda: model.get("num_layers"),
    )
    return SimpleNamespace(
        model_config=model_config,
        cache_config=SimpleNamespace(cache_dtype=cache_dtype),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=True),
        speculative_config=None,
    )


def backend_name(model: Mapping[str, Any]) -> str:
    """The attention backend a model of this kind runs under, as hashed [MODEL-3]."""
    return "FLASHMLA" if model.get("attention") == "mla" else "FLASH_ATTN"


# -- the adapter ---------------------------------------------------------------------------


class VllmNixlAdapter(
    Adapter, AgreementProtocol, RoutingProtocol, TopologyProtocol, SenderProtocol, ReceiverProtocol
):
    """vLLM's NIXL pull mapping (``vllm``) through kvspec; see the module docstring."""

    name = NAME
    domain = DOMAIN
    policies = (VLLM_NIXL,)  # reads prefill rank dst*P//D, or a window's first per head
    policy_rules = MappingProxyType({VLLM_NIXL: vllm_nixl_read})
    slicing_modes = ("sender",)  # a read fetches exactly its slice
    refusal_types = (AssertionError, ValueError, NotImplementedError, RuntimeError)

    def __init__(self) -> None:
        self.utils = import_engine(
            "vllm.distributed.kv_transfer.kv_connector.utils", adapter=NAME, install=INSTALL
        )
        self.tp_mapping = import_engine(
            "vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping",
            adapter=NAME,
            install=INSTALL,
        )
        self.metadata = import_engine(
            "vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata",
            adapter=NAME,
            install=INSTALL,
        )
        self.specs = import_engine("vllm.v1.kv_cache_interface", adapter=NAME, install=INSTALL)
        import vllm

        self.version = f"vllm {vllm.__version__}"

    def supports(self, case: TransferCase) -> bool:
        return not refuses_replicated_fan_in(case)

    def _topology(self, tp: int, rank: int, model: Mapping[str, Any]) -> Any:
        return self.utils.TransferTopology(
            tp_rank=rank,
            tp_size=tp,
            block_size=16,
            engine_id="decode",
            is_mla=model.get("attention") == "mla",
            is_mamba=False,
            total_num_kv_heads=model.get("num_kv_heads"),
            attn_backends=[],
        )

    def _mapping(self, case: TransferCase, dst: int) -> Any:
        if case.policy != VLLM_NIXL:
            raise ValueError(
                f"vLLM NIXL has one replica rule, {VLLM_NIXL!r} (compute_tp_mapping); policy "
                f"{case.policy!r} cannot be configured [PLAN-4.4]"
            )
        topology = self._topology(case.target.tp, dst, case.model.to_dict())
        return self.tp_mapping.compute_tp_mapping(
            topology, case.source.tp, (self.specs.FullAttentionSpec,)
        )

    # routing [PLAN-2, PLAN-3] ------------------------------------------------------------
    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        return list(self._mapping(case, dst).source_ranks_per_group[0])

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        # A prefill rank serves whoever reads it: the inverse of the decode side.
        readers = {dst: self.sources(case, dst) for dst in case.target.ranks()}
        self._check_consumers(case, src, readers)
        return invert_sources(readers, case.source.ranks())[src]

    def _check_consumers(
        self, case: TransferCase, src: int, readers: Mapping[int, Sequence[int]]
    ) -> None:
        """``TPMapping.local_consumers`` against the notifications prefill rank ``src``
        really gets: each decode rank announces ``request_id:local_consumers`` with each
        read it posts (``pull_worker._read_blocks``) and, for MLA reading one of several
        prefill ranks, in a notification to every other prefill rank it handshook with
        (``_remote_agents``, from ``handshake_target_ranks``); the prefill frees the
        request's blocks once that many have come (``_get_new_notifs``). Fewer notifiers
        than announced hold the blocks until the abort timeout; more free them while a
        read may still be in flight. Either is raised (RuntimeError)."""
        mla = case.model.attention == "mla"
        notifiers, announced = [], set()
        for dst in case.target.ranks():
            mapping = self._mapping(case, dst)
            reads = readers[dst]
            notifies = src in reads
            if mla and case.source.tp > case.target.tp and len(reads) == 1:
                topology = self._topology(case.target.tp, dst, case.model.to_dict())
                notifies = notifies or src in topology.handshake_target_ranks(case.source.tp)
            if notifies:
                notifiers.append(dst)
                announced.add(getattr(mapping, "local_consumers", len(notifiers)))
        if notifiers and announced != {len(notifiers)}:
            raise RuntimeError(
                f"prefill rank {src} is notified by decode ranks {notifiers} but they announce "
                f"local_consumers {sorted(announced)}: it frees the request's blocks after the "
                f"wrong number of notifications ({case.describe()})"
            )

    # what a read fetches, where it lands [SLICE-1, RESHARD-2] ----------------------------
    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        out = {}
        for dst in self.targets(case, src):
            out[dst] = self._read(case, dst, shard)
        return out

    def _read(self, case: TransferCase, dst: int, whole: RequestKV) -> RequestKV:
        mapping = self._mapping(case, dst)
        if case.target.tp < case.source.tp and case.model.attention != "mla":
            return whole  # each remote block is read whole into its slot (tp_ratio < 0)
        heads = local_heads(case.model, case.target.tp)
        return read_slice(whole, mapping.rank_offset_factor, heads)

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        mapping = self._mapping(case, dst)
        by_source = {s.edge.src: s for s in shipments}
        reads = {}
        for src in mapping.source_ranks_per_group[0]:
            if src not in by_source:
                # A planned read that did not complete is a load error for the request.
                raise RuntimeError(f"decode rank {dst}: no data read from prefill rank {src}")
            s = by_source[src]
            reads[src] = s.kv if s.marker.applied else self._read(case, dst, s.kv)
        return place_reads(
            reads,
            mapping.rank_to_attention_slot,
            heads=local_heads(case.model, case.target.tp),
        )

    # refusals: topology [PLAN-1] and model facts [MODEL-3, DTYPE-1] -----------------------
    def validate_topology(self, config: TransferConfig) -> None:
        if config["target"].get("pp", 1) != 1:
            raise NotImplementedError(
                "vLLM NIXL: decode-side pipeline_parallel_size > 1 is not supported "
                "(base_worker.py)"
            )
        rank = config.get("rank", {})
        dst = rank.get("rank", 0) if rank.get("side") == "target" else 0
        topology = self._topology(config["target"]["tp"], dst, config["model"])
        topology.tp_ratio(config["source"]["tp"])
        self.tp_mapping.compute_tp_mapping(
            topology, config["source"]["tp"], (self.specs.FullAttentionSpec,)
        )

    # start-up validation [serving reachability] -------------------------------------------
    def serving_accepts(self, config: TransferConfig) -> Acceptance | None:
        """Whether vLLM starts a NIXL prefill/decode pair with ``config``, by its own code,
        on CPU: for each side ``ModelConfig.verify_with_parallel_config``'s attention-head
        check (vllm/config/model.py, called on the attributes it reads) and
        ``QKVParallelLinear.__init__``'s KV-head split (vllm/model_executor/layers/
        linear.py, ``divide`` asserts), run until it has split the heads; then the decode's
        handshake ``TransferTopology.tp_ratio`` and ``compute_tp_mapping``, and the decode
        PP refusal of base_worker.py. Query heads are chosen divisible by both TP sizes
        (kvspec models only KV heads). Not run: building a ``VllmConfig`` from a model
        directory, weight loading, NIXL agents."""
        model, kv_heads = config["model"], kv_heads_of(config)
        tps = (int(config["source"]["tp"]), int(config["target"]["tp"]))
        try:
            ran = both_sides_head_checks(config, adapter=NAME, install=INSTALL)
            self.validate_topology(config)
            ran.append("decode handshake: tp_ratio, compute_tp_mapping")
            fan_in = SimpleNamespace(
                model=SimpleNamespace(attention=model.get("attention"), num_kv_heads=kv_heads),
                source=SimpleNamespace(tp=tps[0]),
                target=SimpleNamespace(tp=tps[1]),
            )
            if refuses_replicated_fan_in(fan_in):
                return Acceptance(
                    False,
                    f"{self.version} refuses it at the handshake: base_worker."
                    "_validate_remote_agent_handshake asserts `not (tp_ratio < 0 and "
                    f"is_kv_replicated)` (prefill TP{tps[0]} > decode TP{tps[1]} with "
                    f"{kv_heads} KV heads replicated); read, not run (it needs a worker)",
                )
        except (AssertionError, ValueError, NotImplementedError) as error:
            return Acceptance(False, f"{self.version} refuses it: {engine_message(error)}")
        return Acceptance(True, f"{self.version} accepts it ({'; '.join(ran)})")

    def validate_agreement(self, config: TransferConfig) -> None:
        model = config["model"]
        theirs = config.get("target_model", model)
        if self._hash(theirs) != self._hash(model):
            differ = {
                k: (model.get(k), theirs.get(k)) for k in model if model.get(k) != theirs.get(k)
            }
            raise RuntimeError(
                "vLLM NIXL handshake: compatibility hashes differ (enforce_handshake_compat); "
                f"prefill vs decode model facts: {differ}"
            )

    def _hash(self, model: Mapping[str, Any]) -> str:
        return self.metadata.compute_nixl_compatibility_hash(
            vllm_config(model), backend_name(model), "pull"
        )
