"""What the byte-range data paths (``--transfer pull``, :mod:`sim.paths.pull`; ``--transfer
write``, :mod:`sim.paths.write`) share: every rank's caches registered as regions, the shares
of one (request, chunk, edge) both sides compute alike, and the check of the ranges'
CRC before a byte lands.

Both paths move exactly the bytes the spec's descriptor list names [DESC-1..3], from
the sender's registered memory into the receiver's, computed on each side from the
configuration and the workload; :class:`RegionPath` is their common part of the data
path interface (:class:`sim.paths.datapath.DataPath`). Neither path derives from the other.
"""

from __future__ import annotations

from typing import Any

from kvspec.memory.descriptors import RegisteredCache, region_buffers, share_positions
from kvspec.memory.paged import blocks_needed
from kvspec.topology.tokens import Tokens
from kvspec.transport.checksums import ALGORITHMS, checksum_of, fastest
from sim.net import messages
from sim.paths.datapath import Checked, Incoming, PathPorts
from sim.run.config import SimConfig
from sim.run.workload import Workload, edge_chunks


def ranges_intact(head: dict[str, Any], ranges: list[Any], *, required: bool) -> bool:
    """Whether the ranges of a pull answer or a write match the envelope's ``ranges_crc``,
    by the algorithm ``ranges_alg`` names (``crc32`` when absent; one outside
    :data:`~kvspec.transport.checksums.ALGORITHMS` is refused) — CRC-32 [WIRE-6] or
    CRC-32C [WIRE-7] over the received frames in place, before a byte lands. Checked when
    ``required`` (the run uses checksums) or whenever the envelope carries one; with
    neither, nothing to check."""
    if not required and "ranges_crc" not in head:
        return True
    algorithm = head.get("ranges_alg", "crc32")
    if algorithm not in ALGORITHMS:
        return False
    return head.get("ranges_crc") == checksum_of(algorithm, ranges)


def read_head(ep: PathPorts, frames: list[bytes]) -> tuple[int, dict[str, Any]] | None:
    """(receiver, header) of a read ``[route, header, body]`` on a sender's KV socket: from
    a verified receiver, its header JSON; else None, counted as a stranger's
    (``kv reads refused``). Whether the read asks for what it may is the path's to judge."""
    peer, head_frame, _ = frames
    dst = ep.out.receiver_of(peer)
    if dst is None:
        ep.view.strangers["kv reads refused"] += 1
        return None
    try:
        return dst, messages.load(head_frame, limit=messages.MAX_ENVELOPE)
    except messages.MessageError:
        ep.view.strangers["kv reads refused"] += 1
        return None


def registered_cache(
    config: SimConfig, workload: Workload, stage: int, who: int
) -> RegisteredCache:
    """The registration of rank ``who`` of ``stage`` in this run: every rank computes the
    same, from the configuration and the workload [DESC-2]."""
    layout, block_size = config.layout_of(stage)
    num_blocks, _ = workload.block_table(stage, who)
    return RegisteredCache.of_rank(
        layout,
        config.stages[stage],
        config.model,
        who,
        num_blocks=num_blocks,
        block_size=block_size,
    )


def pick(tokens: Tokens, positions: range) -> Tokens:
    """The tokens at ``positions`` of ``tokens``' ascending order."""
    out, before = [], 0
    for r in tokens.ranges:
        start, stop = max(positions.start - before, 0), min(positions.stop - before, len(r))
        if start < stop:
            out.append(range(r.start + start, r.start + stop))
        before += len(r)
    return Tokens.of(out)


class RegionPath:
    """The common part of the pull and write paths: registration, the shares of an edge,
    the keys a sender owes, and the ranges' CRC in the admission."""

    def __init__(self, ep: PathPorts) -> None:
        self.ep = ep
        self.started = False
        self.algorithm = fastest()  # of the ranges sent [WIRE-6, WIRE-7]
        self.ready_requests: set[str] = set()
        self.keys_of: dict[str, tuple[str, int, int]] = {}  # key -> (request, chunk, dst)
        self.answered: set[str] = set()
        self._tables: dict[tuple[int, int], dict[str, list[int]]] = {}
        self._registered: dict[tuple[int, int], RegisteredCache] = {}

    def register(self) -> None:
        """Register this rank's regions, its sources' as it computes them, and the keys it
        owes each receiver."""
        ep = self.ep
        cache = ep.view.memory.cache
        self.own = RegisteredCache.of(cache, head_dim=ep.view.config.model.head_dim)
        self.buffers = region_buffers(cache)
        self.names = list(self.own.regions())
        if ep.view.out_plan is not None:
            for request in ep.view.workload.requests:
                for key, dst, chunk in ep.out.out_keys(request):
                    self.keys_of[key] = (request.request_id, chunk, dst)
        if ep.view.in_plan is not None:
            self.sources = {src: self._peer(ep.view.who.stage - 1, src) for src in ep.view.sources}
            self.source_index = {
                src: {name: i for i, name in enumerate(registered.regions())}
                for src, registered in self.sources.items()
            }
        self.own_index = {name: i for i, name in enumerate(self.names)}
        self.started = True

    def _peer(self, stage: int, who: int) -> RegisteredCache:
        if (stage, who) not in self._registered:
            ep = self.ep
            self._registered[(stage, who)] = registered_cache(
                ep.view.config, ep.view.workload, stage, who
            )
        return self._registered[(stage, who)]

    def _table(self, stage: int, who: int) -> dict[str, list[int]]:
        if (stage, who) not in self._tables:
            self._tables[(stage, who)] = self.ep.view.workload.block_table(stage, who)[1]
        return self._tables[(stage, who)]

    def share(
        self, request_id: str, chunk: int, src: int, dst: int, *, as_sender: bool
    ) -> tuple[Any, ...]:
        """The arguments of the spec's list of one (request, chunk, edge) [DESC-1..3]:
        (plan, edge, source, its blocks, target, its blocks, tokens). The chunk is a piece
        of the edge's own tokens, as a push payload's is [CHUNK-1, PLAN-6]; each side's
        blocks run up to the chunk's last slot [PAGED-3]."""
        ep = self.ep
        request = ep.view.requests[request_id]
        book = ep.view.out_plan if as_sender else ep.view.in_plan
        assert book is not None
        plan = book.of(request)
        tables = ep.view.memory.tables
        if as_sender:
            source, source_ids = self.own, tables[request_id]
            target = self._peer(ep.view.who.stage + 1, dst)
            target_ids = self._table(ep.view.who.stage + 1, dst)[request_id]
        else:
            source = self.sources[src]
            source_ids = self._table(ep.view.who.stage - 1, src)[request_id]
            target, target_ids = self.own, tables[request_id]
        edge = plan.edge(src, dst)
        carried = Tokens.span(0, request.seq_len) if edge.tokens is None else edge.tokens
        tokens = pick(carried, edge_chunks(len(carried), ep.view.config.chunks)[chunk])
        share = share_positions(plan, edge, tokens)
        need_src = blocks_needed(share.source_slots, source.block_size)
        need_dst = blocks_needed(share.target_slots, target.block_size)
        return plan, edge, source, source_ids[:need_src], target, target_ids[:need_dst], tokens

    def served(self) -> bool:
        """Whether every key of every receiver was answered (or skipped): the streams end."""
        out = self.ep.out
        return all(
            key in self.answered or out.is_skipped(dst, key)
            for key, (_, _, dst) in self.keys_of.items()
        )

    # -- receiving: this part of the admission ---------------------------------------
    def complete(self, src: int, frames: list[Any], received_at: float) -> None:
        self.ep.inbound.admit(src, frames, received_at, self)

    def second_copy(self, key: str, head: dict[str, Any], frames: list[Any]) -> None:
        return  # a receiver holds its blocks from the start: a copy is only booked

    def check(
        self, state: Incoming, src: int, key: str, head: dict[str, Any], frames: list[Any]
    ) -> Checked:
        """The ranges' CRC, over the received frames in place [WIRE-6, WIRE-7]."""
        ranges = [f.buffer for f in frames[1:]]
        if not ranges_intact(head, ranges, required=self.ep.view.config.checksum):
            return Checked(refusal=f"the ranges of {key} from source rank {src} fail their CRC")
        return Checked(ranges)

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        raise NotImplementedError  # each path lands its ranges its own way

    def finish(self, state: Incoming, received_at: float) -> None:
        """Every range of the request is in the cache: verify now, or once all have landed."""
        self.ep.view.stats["requests_pulled"] += 1
        self.ep.inbound.landed(state, received_at)
