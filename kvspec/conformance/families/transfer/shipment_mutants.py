"""Mutants of a receiver that accepts more than exactly its plan's shipments [RESHARD-3,
DTYPE-3].

Each assembles correct shipments correctly; it only forgives one kind of wrong set —
by dropping, deduplicating, truncating or trusting — instead of refusing it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.tensors.dtypes import FP8_DTYPES
from kvspec.tensors.kv import RequestKV
from kvspec.tensors.reshard import Shipment, receive


@mutant("RESHARD-3.1")
class PadsMissingShipment(ReferenceAdapter):
    """Fills the heads of a missing sender with zeros instead of refusing."""

    def receiver_combine(self, case, dst, shipments):
        plan = self.plan(case)
        have = {s.edge.src for s in shipments}
        padded = list(shipments)
        template = shipments[0] if shipments else None
        for src in plan.sources_of(dst):
            if src not in have and template is not None:
                edge = plan.edge(src, dst)
                shape = list(template.kv.data.shape)
                shape[0], shape[3] = len(edge.layers), len(edge.heads)
                marker = replace(
                    template.marker,
                    offset_in_shard=edge.offset_in_shard,
                    num_slices=edge.num_slices,
                    applied=True,
                    side="sender",
                )
                zeros = template.kv.data.new_zeros(shape)
                scales = (
                    None
                    if template.kv.scales is None
                    else template.kv.scales[:1].expand(len(edge.layers), -1)
                )
                padded.append(Shipment(edge, marker, RequestKV(zeros, scales)))
        return receive(plan, dst, padded)


@mutant("RESHARD-3.2")
class IgnoresStrangers(ReferenceAdapter):
    """Silently drops shipments from ranks that are not among its plan sources."""

    def receiver_combine(self, case, dst, shipments):
        sources = set(self.plan(case).sources_of(dst))
        return super().receiver_combine(case, dst, [s for s in shipments if s.edge.src in sources])


@mutant("RESHARD-3.3")
class DedupsBySource(ReferenceAdapter):
    """Keeps the last shipment of each source, so a repeated shipment passes unnoticed."""

    def receiver_combine(self, case, dst, shipments):
        by_source = {s.edge.src: s for s in shipments}
        return super().receiver_combine(case, dst, list(by_source.values()))


@mutant("RESHARD-3.4")
class MatchesBySourceOnly(ReferenceAdapter):
    """Looks shipments up by sender rank and trusts them to carry the plan's edge."""

    def receiver_combine(self, case, dst, shipments):
        plan = self.plan(case)
        sources = set(plan.sources_of(dst))
        fixed = [
            replace(s, edge=plan.edge(s.edge.src, dst)) if s.edge.src in sources else s
            for s in shipments
        ]
        return super().receiver_combine(case, dst, fixed)


@mutant("RESHARD-3.5")
class TruncatesToShortest(ReferenceAdapter):
    """Assembles the tokens every shipment has: a shipment a token short shortens them all."""

    def receiver_combine(self, case, dst, shipments):
        if not shipments:
            return super().receiver_combine(case, dst, shipments)
        seq = min(s.kv.data.shape[2] for s in shipments)
        cut = [replace(s, kv=RequestKV(s.kv.data[:, :, :seq], s.kv.scales)) for s in shipments]
        return super().receiver_combine(case, dst, cut)


@mutant("RESHARD-3.6")
class NarrowsToEdge(ReferenceAdapter):
    """Cuts a shipment larger than its edge down to the edge's layers, heads and head_dim."""

    def receiver_combine(self, case, dst, shipments):
        fixed = []
        for s in shipments:
            data = s.kv.data
            heads = len(s.edge.heads) * (1 if s.marker.applied else s.marker.num_slices)
            data = data[: len(s.edge.layers), :, :, :heads, : case.model.head_dim]
            scales = None if s.kv.scales is None else s.kv.scales[: len(s.edge.layers)]
            fixed.append(replace(s, kv=RequestKV(data, scales)))
        return super().receiver_combine(case, dst, fixed)


@mutant("DTYPE-3.2")
class ComparesOnlyKeyScales(ReferenceAdapter):
    """Checks that senders agree on the K scales of a shared layer, not on the V scales."""

    def receiver_combine(self, case, dst, shipments):
        first: dict[int, torch.Tensor] = {}
        fixed = []
        for s in shipments:
            scales = s.kv.scales
            if scales is not None and scales.shape[1] == 2:
                scales = scales.clone()
                for i, layer in enumerate(s.edge.layers):
                    if layer in first:
                        scales[i, 1] = first[layer]
                    else:
                        first[layer] = scales[i, 1]
            fixed.append(replace(s, kv=RequestKV(s.kv.data, scales)))
        return super().receiver_combine(case, dst, fixed)


@mutant("DTYPE-3.2")
class TrustsFirstSendersScales(ReferenceAdapter):
    """Takes a layer's scales from whichever sender delivered it first, comparing nothing."""

    def receiver_combine(self, case, dst, shipments):
        first: dict[int, torch.Tensor] = {}
        fixed = []
        for s in shipments:
            scales = s.kv.scales
            if scales is not None:
                scales = scales.clone()
                for i, layer in enumerate(s.edge.layers):
                    scales[i] = first.setdefault(layer, scales[i].clone())
            fixed.append(replace(s, kv=RequestKV(s.kv.data, scales)))
        return super().receiver_combine(case, dst, fixed)


@mutant("DTYPE-3.3")
class MissingScalesDefaultToOne(ReferenceAdapter):
    """Reads fp8 KV that came without scales as if every scale were 1.0."""

    def receiver_combine(self, case, dst, shipments):
        fixed = []
        for s in shipments:
            if case.model.dtype in FP8_DTYPES and s.kv.scales is None:
                ones = torch.ones(s.kv.data.shape[0], s.kv.data.shape[1], device=s.kv.device)
                s = replace(s, kv=RequestKV(s.kv.data, ones))
            fixed.append(s)
        return super().receiver_combine(case, dst, fixed)


@mutant("DTYPE-3.4")
class DropsStrayScales(ReferenceAdapter):
    """Drops scales that arrive with KV of a dtype that has none, instead of refusing it."""

    def receiver_combine(self, case, dst, shipments):
        if case.model.dtype not in FP8_DTYPES:
            shipments = [replace(s, kv=RequestKV(s.kv.data)) for s in shipments]
        return super().receiver_combine(case, dst, shipments)
