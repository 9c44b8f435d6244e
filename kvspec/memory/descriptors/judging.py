"""Any descriptor list judged by its effect against the spec's [DESC-1, DESC-2, DESC-3].

A connector's list is right when it stays inside the registered regions and writes each
byte of the receiver's share once, from the sender's byte the spec reads it from, and
nothing else; its order and granularity are free. :func:`judge_descriptors` lists the
first problems, each with its values, the bytes it names read as (layer, block, slot,
head, field) and its obligation, and reports the list's count against the spec's
minimum (:class:`DescriptorVerdict`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from kvspec.memory.descriptors.planning import DescriptorPlan
from kvspec.memory.descriptors.registered import Descriptor


@dataclass(frozen=True)
class DescriptorVerdict:
    """What a list does compared with the spec's [DESC-1..3]: ``problems`` (empty when it
    has the same effect), its count and the minimum."""

    problems: tuple[str, ...]
    count: int
    minimum: int
    share_bytes: int

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def coalesced(self) -> bool:
        return self.count == self.minimum


def judge_descriptors(
    descriptors: Sequence[object], reference: DescriptorPlan, *, limit: int = 5
) -> DescriptorVerdict:
    """Judge ``descriptors`` by effect against the spec's plan [DESC-1, DESC-2].

    It must stay inside the registered regions, write each byte of the receiver's share
    once from the sender's byte the spec reads it from, and write nothing else; order and
    granularity are free. The first ``limit`` problems are listed, each with its values
    and its obligation.
    """
    problems: list[str] = []
    src_regions, dst_regions = reference.source.regions(), reference.target.regions()
    # The spec's runs, sorted by destination: a right range lies inside one of them.
    runs = sorted(reference.descriptors, key=lambda d: (d.dst_region, d.dst_offset))
    keys = [(d.dst_region, d.dst_offset) for d in runs]
    placed: list[tuple[str, int, int, int]] = []
    parsed = []
    for i, value in enumerate(descriptors):
        try:
            parsed.append(Descriptor.of(value))
        except ValueError as error:
            problems.append(f"descriptor {i}: {error}")
    for i, d in enumerate(parsed):
        for side, region, offset, regions in (
            ("src", d.src_region, d.src_offset, src_regions),
            ("dst", d.dst_region, d.dst_offset, dst_regions),
        ):
            if region not in regions:
                problems.append(
                    f"descriptor {i} {d.to_list()}: no {side} region {region!r} (the regions are "
                    f"{', '.join(regions)}) [DESC-2.1]"
                )
            elif offset < 0 or d.length < 1 or offset + d.length > regions[region]:
                problems.append(
                    f"descriptor {i} {d.to_list()}: {side} bytes [{offset}, {offset + d.length}) "
                    f"leave region {region!r} of {regions[region]} bytes [DESC-2.1]"
                )
        if problems and len(problems) >= limit:
            break
        if d.dst_region not in dst_regions or d.length < 1:
            continue
        at = bisect.bisect_right(keys, (d.dst_region, d.dst_offset)) - 1
        run = runs[at] if at >= 0 else None
        inside = (
            run is not None
            and run.dst_region == d.dst_region
            and d.dst_offset + d.length <= run.dst_offset + run.length
        )
        if not inside:
            where = reference.target.locate(d.dst_region, d.dst_offset)
            problems.append(
                f"descriptor {i} {d.to_list()}: writes receiver bytes [{d.dst_offset}, "
                f"{d.dst_offset + d.length}) of {d.dst_region!r} (from {where}) that are not "
                "all in the receiver's share [DESC-1.3]"
            )
            continue
        assert run is not None
        want = run.src_offset + (d.dst_offset - run.dst_offset)
        if d.src_region != run.src_region or d.src_offset != want:
            problems.append(
                f"descriptor {i} {d.to_list()}: receiver bytes at {d.dst_offset} of "
                f"{d.dst_region!r} ({reference.target.locate(d.dst_region, d.dst_offset)}) "
                f"come from sender byte {d.src_offset} of {d.src_region!r}; they are the "
                f"sender's byte {want} of {run.src_region!r} "
                f"({reference.source.locate(run.src_region, want)}) [DESC-1.1]"
            )
            continue
        placed.append((d.dst_region, d.dst_offset, d.dst_offset + d.length, i))
    placed.sort()
    for (r1, _, e1, i1), (r2, s2, e2, i2) in itertools.pairwise(placed):
        if r1 == r2 and s2 < e1:
            problems.append(
                f"descriptors {i1} and {i2} both write receiver bytes [{s2}, {min(e1, e2)}) of "
                f"{r1!r} ({reference.target.locate(r1, s2)}) [DESC-1.2]"
            )
    covered = sum(e - s for _, s, e, _ in placed)
    if not any("[DESC-1.2]" in p for p in problems) and covered < reference.share_bytes:
        missing = _first_gap(placed, runs)
        problems.append(
            f"{reference.share_bytes - covered} byte(s) of the receiver's share are never "
            f"written; the first at {missing} [DESC-1.1]"
        )
    return DescriptorVerdict(
        tuple(problems[:limit]), len(parsed), len(reference.descriptors), reference.share_bytes
    )


def _first_gap(placed: list[tuple[str, int, int, int]], runs: list[Descriptor]) -> str:
    by_region: dict[str, list[tuple[int, int]]] = {}
    for region, start, end, _ in placed:
        by_region.setdefault(region, []).append((start, end))
    for run in runs:
        cursor = run.dst_offset
        for start, end in sorted(by_region.get(run.dst_region, [])):
            if end <= cursor or start >= run.dst_offset + run.length:
                continue
            if start > cursor:
                break
            cursor = max(cursor, end)
        if cursor < run.dst_offset + run.length:
            return f"byte {cursor} of {run.dst_region!r}"
    return "an unknown byte"
