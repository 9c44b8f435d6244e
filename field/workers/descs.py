"""The descriptor lists a real connector posted, as kvspec descriptors, judged against
DESC-1..3; and the decode caches' verdicts gathered into one result.

Pure data in, data out: no engine is imported, so tests/field/test_workers.py runs it on
captured lists. A worker records (field/workers/vllm_nixl_rank.py ``RecordingAgent``) the
NIXL descriptor lists vLLM prepared, as rows ``(addr, len, dev)`` or NIXL's strided rows
``(addr, len, dev, stride, count)`` (``count`` blocks ``stride`` bytes apart, vLLM 0.33.0
``base_worker._pack_strided_descs``), and each READ it posted as the local and remote
lists' handles and the descriptor indices paired one to one
(``make_prepped_xfer(op, local, local_ids, remote, remote_ids)``). A pair copies the
remote (prefill) descriptor's bytes into the local (decode) one; both must have the same
length. Addresses are turned into kvspec's regions (``L{i}``, one per layer, as
:class:`~kvspec.memory.descriptors.RegisteredCache` names a per-layer cache's) from each
rank's registered layer addresses, and the list is judged by its effect against
:func:`~kvspec.memory.descriptors.plan_descriptors` for the same edge [DESC-1, DESC-2],
its count set beside the spec's minimum [DESC-3].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvspec.memory.cache_layout import get_layout
from kvspec.memory.descriptors import (
    Descriptor,
    RegisteredCache,
    judge_descriptors,
    plan_descriptors,
)
from kvspec.topology.field_policies import FIELD_RULES, VLLM_NIXL
from kvspec.topology.model import ModelShape
from kvspec.topology.plan import TransferPlan, plan_transfer
from kvspec.topology.stage import StageLayout


def expand_rows(rows: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Every descriptor of a NIXL list as ``(addr, len)``, in index order: a 3-column row
    is one descriptor, a 5-column row ``count`` descriptors ``stride`` bytes apart."""
    out: list[tuple[int, int]] = []
    for row in rows:
        if len(row) == 3:
            out.append((int(row[0]), int(row[1])))
        elif len(row) == 5:
            addr, length, _, stride, count = (int(v) for v in row)
            out.extend((addr + k * stride, length) for k in range(count))
        else:
            raise ValueError(
                f"a NIXL descriptor row is (addr, len, dev) or (addr, len, dev, stride, "
                f"count); got {list(row)}"
            )
    return out


@dataclass(frozen=True)
class Regions:
    """One rank's registered layer caches: region ``L{i}`` starts at ``addresses[i]`` and
    holds ``sizes[i]`` bytes."""

    addresses: tuple[int, ...]
    sizes: tuple[int, ...]

    def locate(self, addr: int, length: int) -> tuple[str, int] | None:
        """The region and offset of ``[addr, addr + length)``, or None when the range is
        not inside one region [DESC-2]."""
        for i, (base, size) in enumerate(zip(self.addresses, self.sizes, strict=True)):
            if base <= addr and addr + length <= base + size:
                return f"L{i}", addr - base
        return None


@dataclass(frozen=True)
class PostedRead:
    """One READ as kvspec descriptors, with the pairs that could not be translated."""

    descriptors: tuple[Descriptor, ...]
    problems: tuple[str, ...]


def posted_read(
    read: Mapping[str, Any],
    dlists: Mapping[str, Mapping[str, Any]],
    source: Regions,
    target: Regions,
) -> PostedRead:
    """The descriptors one READ posted: remote (sender) bytes into local (receiver) bytes."""
    local = expand_rows(dlists[str(read["local"])]["rows"])
    remote = expand_rows(dlists[str(read["remote"])]["rows"])
    local_ids, remote_ids = list(read["local_ids"]), list(read["remote_ids"])
    problems: list[str] = []
    if len(local_ids) != len(remote_ids):
        problems.append(
            f"the READ pairs {len(local_ids)} local with {len(remote_ids)} remote descriptors"
        )
    out = []
    for k, (li, ri) in enumerate(zip(local_ids, remote_ids, strict=False)):
        if not (0 <= li < len(local) and 0 <= ri < len(remote)):
            problems.append(
                f"pair {k}: index {li} of {len(local)} local / {ri} of {len(remote)} remote "
                "descriptors is out of range [DESC-2]"
            )
            continue
        (dst_addr, dst_len), (src_addr, src_len) = local[li], remote[ri]
        if dst_len != src_len:
            problems.append(
                f"pair {k}: {src_len} remote bytes into a {dst_len}-byte local descriptor"
            )
        length = min(dst_len, src_len)
        src, dst = source.locate(src_addr, length), target.locate(dst_addr, length)
        if src is None or dst is None:
            side, addr = ("remote", src_addr) if src is None else ("local", dst_addr)
            problems.append(
                f"pair {k}: the {side} range of {length} bytes at {hex(addr)} is not inside "
                "one registered layer region [DESC-2]"
            )
            continue
        out.append(Descriptor(src[0], src[1], dst[0], dst[1], length))
    return PostedRead(tuple(out), tuple(problems))


def transfer_plan(source_tp: int, target_tp: int, model: ModelShape) -> TransferPlan:
    """kvspec's plan under vLLM 0.33.0's replica rule (decode pulls one replica per head,
    kvspec/topology/field_policies.py ``vllm_nixl_read``)."""
    return plan_transfer(
        StageLayout(source_tp),
        StageLayout(target_tp),
        model,
        policy=VLLM_NIXL,
        rule=FIELD_RULES[VLLM_NIXL],
    )


def registered_cache(
    layout: str, model: ModelShape, *, num_blocks: int, block_size: int, heads: int
) -> RegisteredCache:
    """A rank's registered cache as kvspec describes it: every layer, ``heads`` heads;
    ``layout`` is the name the engine's job states, resolved here."""
    return RegisteredCache(
        get_layout(layout),
        model.num_layers,
        num_blocks,
        block_size,
        heads,
        model.head_dim,
        model.dtype,
        tensors_per_layer=model.kv_tensors,
    )


def judge_edge(
    plan: TransferPlan,
    src: int,
    dst: int,
    descriptors: Sequence[Descriptor],
    source: RegisteredCache,
    source_ids: Sequence[int],
    target: RegisteredCache,
    target_ids: Sequence[int],
    seq_len: int,
) -> dict[str, Any]:
    """The posted list of edge ``src -> dst`` for ``range(seq_len)`` against the spec's
    [DESC-1..3]; an edge the plan does not have is reported as such [PLAN-2].

    ``verdict`` is ``exact`` when the list has the spec's effect for the request's
    tokens; ``whole blocks`` when it has it for every slot of the request's blocks
    instead: it also writes the slots past the last token of the request's own last
    block, from the sender's same slots (DESC-1.3 forbids that; those slots are the
    request's, and serving writes each before attention reads it, so nothing is harmed);
    ``wrong`` otherwise, with the problems. ``minimum`` is the spec's count for the
    tokens, ``minimum_whole_blocks`` for the whole blocks [DESC-3].
    """
    edges = {(e.src, e.dst): e for e in plan.edges}
    row: dict[str, Any] = {
        "edge": [src, dst],
        "count": len(descriptors),
        "bytes": sum(d.length for d in descriptors),
    }
    if (src, dst) not in edges:
        return {
            **row,
            "in_plan": False,
            "verdict": "wrong",
            "problems": [f"the plan has no edge {src} -> {dst} [PLAN-2]"],
        }
    edge = edges[src, dst]
    exact = judge_descriptors(
        descriptors,
        plan_descriptors(plan, edge, source, source_ids, target, target_ids, range(seq_len)),
        limit=3,
    )
    slots = len(target_ids) * target.block_size
    whole = exact
    if len(source_ids) * source.block_size == slots and slots > seq_len:
        whole = judge_descriptors(
            descriptors,
            plan_descriptors(plan, edge, source, source_ids, target, target_ids, range(slots)),
            limit=3,
        )
    verdict = "exact" if exact.ok else "whole blocks" if whole.ok else "wrong"
    return {
        **row,
        "in_plan": True,
        "verdict": verdict,
        "minimum": exact.minimum,
        "minimum_whole_blocks": whole.minimum,
        "share_bytes": exact.share_bytes,
        "problems": [] if verdict != "wrong" else list(exact.problems),
    }


def missing_edges(plan: TransferPlan, read_edges: set[tuple[int, int]]) -> list[list[int]]:
    """Edges of the plan no READ realised [PLAN-2]."""
    return sorted([e.src, e.dst] for e in plan.edges if (e.src, e.dst) not in read_edges)
