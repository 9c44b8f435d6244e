"""The reference implementation, reached through the same adapter path as everyone else."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, cast

from kvspec import __version__
from kvspec.conformance.adapter import FullAdapter
from kvspec.conformance.domain import EVERYTHING
from kvspec.conformance.transfer_config import TransferConfig
from kvspec.error_cases import OPERATIONS
from kvspec.lifecycle.machine import Lifecycle
from kvspec.memory.cache_layout import convert, detect_layout, field_views, kv_views
from kvspec.memory.descriptors import RegisteredCache, plan_descriptors
from kvspec.memory.paged import PagedCache, gather_request, scatter_request
from kvspec.memory.records import record_fill, record_rows, row_fields, verify_fields
from kvspec.memory.state_cache import state_offset, state_runs
from kvspec.naming.keys import legacy_key, rank_aware_key, recv_keys, send_keys
from kvspec.naming.ports import PortScheme, port, rank_port
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.oracle import oracle_kv, verify
from kvspec.tensors.reshard import HEAD_AXIS, SLICING_MODES, Shipment, receive, send
from kvspec.tensors.slicing import apply_head_slice
from kvspec.tensors.state_oracle import oracle_state
from kvspec.topology.block_size import hybrid_block_size
from kvspec.topology.case import TransferCase
from kvspec.topology.group_plan import GroupPlan
from kvspec.topology.groups import ChunkedLocal, SlidingWindow, StateGroup
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import rank_ownership
from kvspec.topology.plan import POLICIES, ReplicaRule, TransferPlan
from kvspec.topology.stage import StageLayout
from kvspec.topology.state import part_units, plan_state_reads
from kvspec.transport.chunks import reassemble
from kvspec.transport.payload import Payload, merge_payloads
from kvspec.transport.streaming import layer_groups, merge_layers, stream_key
from kvspec.transport.wire import decode, encode


@lru_cache(maxsize=256)
def _plan(case: TransferCase, rule: ReplicaRule | None) -> TransferPlan:
    """Plans are pure functions of the case (and rule): the suite asks for one many times."""
    return case.plan(rule)


def case_group_plan(
    case: TransferCase,
    seq_len: int,
    *,
    rule: ReplicaRule | None = None,
    model: ModelShape | None = None,
    **block_sizes: int,
) -> GroupPlan:
    """The group plan [GROUP-3] of a drawn transfer case (its stages, policy, under
    ``rule`` when the policy is an adapter's own [PLAN-4], and DP groups; ``model``
    replaces the case's), for ``seq_len`` tokens; ``block_sizes`` are
    :func:`~kvspec.topology.group_plan.plan_groups`' ``block_size`` or
    ``source_block_size``/``target_block_size``."""
    return case.group_plan(seq_len, rule, model=model, **block_sizes)


class ReferenceAdapter(FullAdapter):
    """kvspec itself, as an adapter implementing every protocol; where the two disagree,
    the written clause wins."""

    name = "reference"
    version = __version__
    domain = EVERYTHING
    policies = POLICIES
    slicing_modes = SLICING_MODES
    coalesces = True

    def plan(self, case: TransferCase) -> TransferPlan:
        """The spec's plan of ``case``, under a declared policy rule when it names one."""
        return _plan(case, self.policy_rules.get(case.policy))

    def owned(self, layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]:
        owner = rank_ownership(layout, model, rank)
        return owner.heads, owner.layers

    def owned_tokens(
        self, layout: StageLayout, model: ModelShape, rank: int, seq_len: int
    ) -> Sequence[range]:
        tokens = rank_ownership(layout, model, rank, seq_len=seq_len).tokens
        return [range(seq_len)] if tokens is None else list(tokens.ranges)

    def sources(self, case: TransferCase, dst: int) -> Sequence[int]:
        return self.plan(case).sources_of(dst)

    def targets(self, case: TransferCase, src: int) -> Sequence[int]:
        return self.plan(case).targets_of(src)

    def sender_transform(
        self, case: TransferCase, src: int, shard: RequestKV, slicing: str
    ) -> dict[int, RequestKV]:
        return {s.edge.dst: s.kv for s in send(self.plan(case), src, shard, slicing=slicing)}

    def receiver_combine(
        self, case: TransferCase, dst: int, shipments: Sequence[Shipment]
    ) -> RequestKV:
        return receive(self.plan(case), dst, shipments)

    def apply_marker(self, case: TransferCase, dst: int, shipment: Shipment) -> Shipment:
        data, marker = apply_head_slice(
            shipment.kv.data, shipment.marker, my_rank=dst, head_axis=HEAD_AXIS
        )
        return Shipment(shipment.edge, marker, RequestKV(data, shipment.kv.scales))

    def validate_sizes(self, config: TransferConfig) -> None:
        OPERATIONS["transfer"](config)

    def validate_partition(self, config: TransferConfig) -> None:
        OPERATIONS["transfer"](config)

    def validate_topology(self, config: TransferConfig) -> None:
        OPERATIONS["transfer"](config)

    def validate_model(self, config: TransferConfig) -> None:
        OPERATIONS["transfer"](config)

    def validate_agreement(self, config: TransferConfig) -> None:
        OPERATIONS["transfer"](config)

    def read_layer(
        self, cache: Any, layout: str, *, page_size: int | None = None
    ) -> tuple[Any, ...]:
        return kv_views(cache, layout, block_size=page_size)

    def convert_layout(
        self,
        cache: Any,
        source: str,
        target: str,
        *,
        page_size: int | None = None,
        block_size: int | None = None,
    ) -> Any:
        return convert(cache, source, target, block_size=block_size, source_block_size=page_size)

    def read_fields(
        self, cache: Any, layout: str, *, page_size: int | None = None
    ) -> dict[str, Any]:
        return field_views(cache, layout, block_size=page_size)

    def detect_layout(self, cache: Any, **known: int | None) -> str:
        return detect_layout(cache, **known)

    def gather(self, cache: PagedCache, block_ids: list[int], seq_len: int) -> RequestKV:
        return gather_request(cache, block_ids, seq_len)

    def scatter(self, kv: RequestKV, cache: PagedCache, block_ids: list[int]) -> None:
        scatter_request(kv, cache, block_ids)

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
        plan = self.plan(case)
        edge = plan.edge(src, dst)
        made = plan_descriptors(plan, edge, source, source_ids, target, target_ids, tokens)
        return made.descriptors

    def oracle_fill(self, model: ModelShape, request_id: str, **region: Any) -> RequestKV:
        return oracle_kv(model, request_id, **region)

    def oracle_verify(
        self, kv: RequestKV, model: ModelShape, request_id: str, **region: Any
    ) -> int:
        verdict = verify(kv, model, request_id, **region)
        return verdict.mismatches + verdict.scale_mismatches

    def state_units(
        self, layout: StageLayout, model: ModelShape, group: int, rank: int
    ) -> dict[str, range]:
        state = cast(StateGroup, model.layer_groups[group])  # state_units: of a state group
        return part_units(state, layout.attn_tp, layout.locate(rank).attn_tp_rank)

    def state_reads(
        self, case: TransferCase, group: int, dst: int
    ) -> list[tuple[int, int, int, int, int]]:
        reads = plan_state_reads(
            case.source,
            case.target,
            case.model,
            group,
            policy=case.policy,
            rule=self.policy_rules.get(case.policy),
            source_dp=case.source_dp,
            target_dp=case.target_dp,
        )
        return [
            (r.src, r.layer, r.src_offset, r.dst_offset, r.length) for r in reads if r.dst == dst
        ]

    def group_bytes(
        self, case: TransferCase, seq_len: int, block_size: int
    ) -> dict[tuple[int, int, int], int]:
        rule = self.policy_rules.get(case.policy)
        return case_group_plan(case, seq_len, rule=rule, block_size=block_size).bytes_per_edge()

    def window_tokens(
        self, case: TransferCase, seq_len: int, source_block_size: int, target_block_size: int
    ) -> dict[tuple[int, int, int], list[tuple[int, int]]]:
        plan = case_group_plan(
            case,
            seq_len,
            rule=self.policy_rules.get(case.policy),
            source_block_size=source_block_size,
            target_block_size=target_block_size,
        )
        groups = case.model.layer_groups
        return {
            (e.group, e.src, e.dst): [(r.start, r.stop) for r in e.tokens.ranges]
            for e in plan.edges
            if e.tokens is not None and isinstance(groups[e.group], SlidingWindow | ChunkedLocal)
        }

    def hybrid_block_size(self, model: ModelShape, attn_tp: int, block_size: int | None) -> int:
        return hybrid_block_size(model, attn_tp, block_size=block_size)

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
    ) -> dict[str, Any]:
        return oracle_state(
            model,
            group,
            request_id,
            layers=layers,
            attn_tp=attn_tp,
            attn_tp_rank=attn_tp_rank,
            seed=seed,
        )

    def state_offset(self, layout: str, model: ModelShape, group: int, **where: Any) -> int:
        return state_offset(layout, model, group, **where)

    def state_runs(
        self, layout: str, model: ModelShape, group: int, **where: Any
    ) -> tuple[tuple[int, int], ...]:
        return state_runs(layout, model, group, **where)

    def record_fill(
        self, model: ModelShape, layout: str, request_id: str, **region: Any
    ) -> dict[str, Any]:
        return record_fill(model, layout, request_id, **region)

    def record_verify(
        self, fields: Any, model: ModelShape, layout: str, request_id: str, **region: Any
    ) -> int:
        return verify_fields(fields, model, layout, request_id, **region).mismatches

    def record_rows(self, fields: Any, model: ModelShape, layout: str) -> Any:
        return record_rows(fields, model, layout)

    def record_fields(self, rows: Any, model: ModelShape, layout: str) -> dict[str, Any]:
        return row_fields(rows, model, layout)

    def rank_aware_key(self, *args: Any, **kwargs: Any) -> str:
        return rank_aware_key(*args, **kwargs)

    def legacy_key(self, *args: Any, **kwargs: Any) -> str:
        return legacy_key(*args, **kwargs)

    def send_keys(
        self, case: TransferCase, request_id: str, src: int, **stages: Any
    ) -> tuple[tuple[str, int], ...]:
        return send_keys(self.plan(case), request_id, src, **stages)

    def recv_keys(
        self, case: TransferCase, request_id: str, dst: int, **stages: Any
    ) -> tuple[tuple[str, int], ...]:
        return recv_keys(self.plan(case), request_id, dst, **stages)

    def kv_port(self, base: int, stage: int, rank: int, replica: int) -> int:
        return port("kv", base, stage, rank, replica)

    def stage_port(
        self,
        base: int,
        stage: int,
        layout: StageLayout,
        rank: int,
        replica: int,
        scheme: PortScheme,
    ) -> int:
        return rank_port("kv", base, stage, layout, rank, replica, scheme=scheme)

    def merge(
        self, case: TransferCase, dst: int, received: Sequence[tuple[int, Payload]]
    ) -> Payload:
        return merge_payloads(self.plan(case), dst, received)

    def reassemble(self, chunks: Sequence[Payload]) -> Payload:
        return reassemble(chunks)

    def layer_groups(self, num_layers: int, groups: int) -> Sequence[range]:
        return layer_groups(num_layers, groups)

    def stream_key(self, *args: Any) -> str:
        return stream_key(*args)

    def merge_layers(
        self, case: TransferCase, dst: int, group: range, received: Sequence[tuple[int, Payload]]
    ) -> RequestKV:
        return merge_layers(self.plan(case), dst, group, received)

    def encode(self, payload: Payload) -> Sequence[Any]:
        return encode(payload)

    def decode(self, frames: Sequence[bytes]) -> Payload:
        return decode(frames)

    def lifecycle(self, num_blocks: int) -> Lifecycle:
        return Lifecycle(num_blocks)
