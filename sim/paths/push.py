"""``--transfer push`` (the default): senders send payloads [PAYLOAD-1] in the wire format
[WIRE-1]; receivers decode, merge, reassemble and scatter them into their own paged
cache [PAYLOAD-3, CHUNK-2, PAGED-4].

As a sender, a rank gathers each request from its cache once, cuts it into one payload
per plan edge (:func:`kvspec.tensors.reshard.send`), each cut into chunks of the edge's
own tokens [CHUNK-1], and sends them chunk by chunk, edge by edge — or, streamed
[STREAM-1], each layer group as soon as its layers are computed — through
:meth:`sim.rank.sender.Sender.transmit`, which applies and books the run's faults. As a
receiver, what arrives is admitted by the one admission
(:meth:`sim.rank.receiver.Receiver.admit`); this path's part of it is the block pool's
handles [LIFE-1, LIFE-4] and the codec (:func:`kvspec.transport.wire.decode`), then the
landing: a streamed layer group once every source's part is here, a whole request once
every chunk is.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

from kvspec.memory.paged import blocks_needed
from kvspec.tensors.reshard import send
from kvspec.transport.chunks import reassemble, split_chunks
from kvspec.transport.payload import (
    Payload,
    merge_payloads,
    merge_to_request_kv,
    payload_from_shipment,
)
from kvspec.transport.streaming import (
    group_layers,
    group_sources,
    layer_part,
    merge_layers,
    stream_key,
)
from kvspec.transport.wire import WireError, decode
from sim.cache.staging import Slot
from sim.net import messages
from sim.paths.datapath import Checked, Incoming, PathPorts
from sim.run.workload import Request, edge_chunks


class PushPath:
    """The push data path of one rank (:class:`sim.paths.datapath.DataPath`)."""

    def __init__(self, ep: PathPorts) -> None:
        self.ep = ep

    def prepare(self) -> None:
        return  # a payload needs no registration

    def start(self) -> None:
        return

    def progress(self) -> None:
        return  # nothing is asked for: the senders push

    def on_read(self, frames: list[bytes]) -> None:
        self.ep.view.strangers["kv messages"] += 1  # a push sender takes no reads

    def served(self) -> bool:
        return True  # every key went out as its request was posted

    # -- sending ---------------------------------------------------------------------
    def post(self, request_id: str) -> None:
        """Gather one request from the cache and send every chunk along every edge."""
        ep = self.ep
        assert ep.view.out_plan is not None
        memory, config, me = ep.view.memory, ep.view.config, ep.view.who
        request = ep.view.requests[request_id]
        plan = ep.view.out_plan.of(request)
        held = memory.held(request)
        kv, slot = memory.gather(request)
        _, block_size = config.layout_of(me.stage)
        keys = {(dst, c): key for key, dst, c in ep.out.out_keys(request)}
        pieces = []  # per edge, its payload cut into chunks of its own tokens [CHUNK-1]
        for shipment in send(plan, me.rank, kv, slicing=config.slicing):
            whole = shipment.kv.seq_len == held  # the edge takes every token held here
            payload = payload_from_shipment(
                plan,
                shipment,
                request_id,
                block_size=block_size,
                block_ids=memory.tables[request_id] if whole else (),
            )
            sizes = [len(r) for r in edge_chunks(payload.seq_len, config.chunks)]
            chunks = split_chunks(payload, sizes) if len(sizes) > 1 else (payload,)
            pieces.append((shipment.edge.dst, chunks))
        started = time.time() if config.stream != "off" else None
        if ep.view.layer_groups:
            self._stream(request, pieces, started, slot)
            return
        ep.view.compute(len(memory.owner.layers))  # whole: every layer first (none unless --stream)
        for chunk_id in range(len(request.chunks)):  # chunk by chunk, edge by edge
            for dst, chunks in pieces:
                if chunk_id < len(chunks):
                    ep.out.transmit(dst, keys[(dst, chunk_id)], chunks[chunk_id], started, slot)

    def _stream(
        self,
        request: Request,
        pieces: list[tuple[int, Any]],
        started: float | None,
        slot: Slot | None = None,
    ) -> None:
        """Send each layer group of every edge as soon as this rank has computed its
        layers of the group [STREAM-1]."""
        ep = self.ep
        layers, me, groups = ep.view.memory.owner.layers, ep.view.who, ep.view.config.stream_groups
        done = layers.start
        for g, group in enumerate(ep.view.layer_groups):
            mine = group_layers(layers, group)
            if not len(mine):
                continue
            ep.view.compute(mine.stop - done)
            done = mine.stop
            for dst, chunks in pieces:
                part = layer_part(chunks[0], group)
                if part is not None:
                    key = stream_key(request.request_id, me.stage, 0, g, groups, me.rank, dst)
                    ep.out.transmit(dst, key, part, started, slot)

    # -- receiving: this path's part of the admission --------------------------------
    def complete(self, src: int, frames: list[Any], received_at: float) -> None:
        self.ep.inbound.admit(src, frames, received_at, self)

    def second_copy(self, key: str, head: dict[str, Any], frames: list[Any]) -> None:
        """A copy of a shard whose transfer already ended. The rules refuse it [LIFE-4];
        with ``--unsafe-reuse`` it lands where its handle pointed."""
        pool = self.ep.view.memory.pool
        if pool is None or key not in pool.handles:
            return
        if pool.write(key, head["epoch"]) == "stale":
            self._clobber(key, frames)
        else:
            self.ep.view.stats["writes_refused"] += 1

    def check(
        self, state: Incoming, src: int, key: str, head: dict[str, Any], frames: list[Any]
    ) -> Checked:
        """The block pool's handle of the shard (its request's blocks taken on its first
        shard [LIFE-1]; the write refused on a closed handle or a stale epoch [LIFE-4],
        or landing where a stale handle points with ``--unsafe-reuse``), then the codec
        [WIRE-4, WIRE-6, WIRE-7]."""
        ep = self.ep
        pool, request_id = ep.view.memory.pool, state.request.request_id
        if pool is not None and request_id not in pool.tables and not state.done:
            needed = blocks_needed(
                ep.view.memory.held(state.request), ep.view.config.layout_of(ep.view.who.stage)[1]
            )
            pool.admit(request_id, needed, state.keys)
        lands = True
        if pool is not None and request_id in pool.tables:
            outcome = pool.write(key, head["epoch"])
            lands = outcome == "landed"
            if outcome == "stale":
                self._clobber(key, frames)
        try:
            payload = decode(
                [f.buffer for f in frames[1:]], require_checksum=ep.view.config.require_checksum
            )
        except WireError as error:
            if pool is not None and request_id in pool.tables:
                pool.fail(key)
                pool.quiesce(key)  # it arrived whole: nothing more will land from it
            return Checked(
                refusal=f"shard {key} from source rank {src} refused by the codec: {error}"
            )
        if pool is not None and request_id in pool.tables:
            pool.complete(key)
        return Checked(payload, lands=lands)

    def land(self, state: Incoming, src: int, key: str, chunk: int, data: Any) -> int | None:
        """Keep the payload with its request's chunk (a streamed layer group lands once
        every source's part is here); its K and V bytes."""
        payload: Payload = data
        if payload.request_id != state.request.request_id or payload.chunk.chunk_id != chunk:
            self.ep.inbound.fail(
                state,
                f"shard {key} from source rank {src} holds request "
                f"{messages.short(payload.request_id)} chunk {payload.chunk.chunk_id}, not what "
                "its key names",
            )
            return None
        nbytes = sum(
            t.numel() * t.element_size()
            for t in (*payload.key_cache, *payload.value_cache)
            if t is not None
        )
        if self.ep.view.layer_groups:
            # streamed: a layer group lands once every source's part is here
            if not self._land_part(state, self.ep.inbound.group_of(key), src, payload):
                return None
        else:
            state.chunks[chunk].append((src, payload))
        return nbytes

    def finish(self, state: Incoming, received_at: float) -> None:
        if self.ep.view.layer_groups:
            self.ep.inbound.landed(state, received_at)  # every group is in the cache already
        else:
            self._complete(state, received_at)

    def _land_part(self, state: Incoming, g: int, src: int, payload: Payload) -> bool:
        """Keep one source's part of layer group ``g``; once every source's part is here,
        place the group and scatter it into the cache's layers [STREAM-1.3, PAGED-4].
        False when the group was refused (the request has failed)."""
        ep = self.ep
        assert ep.view.in_plan is not None
        parts = state.groups[g]
        parts.append((src, payload))
        plan = ep.view.in_plan.of(state.request)
        group = ep.view.layer_groups[g]
        if len(parts) < len(group_sources(plan, ep.view.who.rank, group)):
            return True
        memory = ep.view.memory
        owned = memory.owner.layers
        mine = group_layers(owned, group)
        first = mine.start - owned.start
        try:
            kv = memory.to_device(merge_layers(plan, ep.view.who.rank, group, parts))
            cache = memory.cache
            layers = replace(
                cache,
                layers=cache.layers[first : first + len(mine)],
                scales=None if cache.scales is None else cache.scales[first : first + len(mine)],
            )
            memory.scatter(kv, layers, memory.tables[state.request.request_id])
        except ValueError as error:
            ep.inbound.fail(
                state, f"layers {mine.start}..{mine.stop - 1} refused on assembly: {error}"
            )
            return False
        del state.groups[g]  # the frames can go: the cache holds these layers now
        return True

    def _complete(self, state: Incoming, received_at: float) -> None:
        """Merge, reassemble and scatter into the cache [PAYLOAD-3, CHUNK-2, PAGED-4]; then
        verify every element now, or once every request has arrived (``verify_after``)."""
        ep = self.ep
        assert ep.view.in_plan is not None
        memory, me = ep.view.memory, ep.view.who.rank
        request = state.request
        plan = ep.view.in_plan.of(request)
        try:
            if len(state.chunks) == 1:  # one chunk: straight to the shard, one copy fewer
                pairs = state.chunks[0]
                kv = merge_to_request_kv(plan, me, pairs, landing=memory.landing)
            elif plan.seq_len is not None:  # edges chunk their own tokens: each, then merge
                by_source: dict[int, list[Payload]] = defaultdict(list)
                for pairs in state.chunks.values():
                    for src, payload in pairs:
                        by_source[src].append(payload)
                whole = [(src, reassemble(chunks)) for src, chunks in by_source.items()]
                kv = merge_to_request_kv(plan, me, whole)
            else:
                merged = [merge_payloads(plan, me, pairs) for pairs in state.chunks.values()]
                kv = reassemble(merged).to_request_kv()
            kv = memory.to_device(kv)
            memory.scatter(kv, memory.cache, memory.tables[request.request_id])
        except ValueError as error:
            ep.inbound.fail(state, f"refused on assembly: {error}")
            return
        state.chunks.clear()  # the frames can go: the cache holds the request now
        ep.inbound.landed(state, received_at)

    def _clobber(self, key: str, frames: list[Any]) -> None:
        """Land a closed handle's data at the blocks it was posted with, as an RDMA write
        to a stale address would: whoever owns those blocks now gets its bytes."""
        pool, cache = self.ep.view.memory.pool, self.ep.view.memory.cache
        assert pool is not None
        try:
            payload = decode([f.buffer for f in frames[1:]])
        except WireError:
            return
        values = next(t for t in payload.key_cache if t is not None).reshape(-1)
        handle = pool.handles[key]
        reused = [b for b in handle.blocks if pool.owner.get(b) not in (None, handle.request)]
        for layer in cache.layers:
            for view in cache.views(layer):
                for block in reused:
                    target = view[block]
                    repeats = -(-target.numel() // max(1, values.numel()))
                    source = values.repeat(repeats)[: target.numel()].reshape(target.shape)
                    target.copy_(source.to(target.dtype))
