"""A descriptor list carried out on byte buffers, as a connector's transfer would [DESC-2].

:func:`region_buffers` gives each registered region of a :class:`~kvspec.memory.paged.
PagedCache` as a flat byte view of its memory; :func:`execute_descriptors` copies each
range of a list from one set of buffers into another, every range checked against its
buffer first, one copy per range as a connector pays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch

from kvspec.memory.descriptors.registered import Descriptor
from kvspec.memory.paged import PagedCache


def region_buffers(cache: PagedCache) -> dict[str, torch.Tensor]:
    """Each registered region of ``cache`` as a flat byte view of its memory [DESC-2]."""
    spec = cache.layout
    if spec.cross_layer:
        assert cache.base is not None
        tensors = {"cache": cache.base}
    elif spec.tuple_form:
        names: tuple[str, ...] = ("K", "V") if len(cache.layers[0]) >= 2 else ("latent",)
        names = (*names, *(side.field.name for side in spec.side))
        tensors = {
            f"L{i}.{n}": t
            for i, layer in enumerate(cache.layers)
            for n, t in zip(names, layer, strict=True)
        }
    else:
        # A layout that is not a tuple form keeps each layer as one tensor.
        tensors = {f"L{i}": cast(torch.Tensor, layer) for i, layer in enumerate(cache.layers)}
    out = {}
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(f"region {name} is not one contiguous range of memory [DESC-2]")
        out[name] = tensor.view(-1).view(torch.uint8)
    return out


def execute_descriptors(
    descriptors: Sequence[Descriptor],
    source: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
) -> int:
    """Carry out ``descriptors``: copy each range from ``source``'s byte buffers into
    ``target``'s; returns the bytes moved. Every range is checked against its buffer first."""
    for d in descriptors:
        for region, offset, buffers in (
            (d.src_region, d.src_offset, source),
            (d.dst_region, d.dst_offset, target),
        ):
            if region not in buffers or offset < 0 or offset + d.length > buffers[region].numel():
                raise ValueError(f"descriptor {d.to_list()} leaves region {region!r} [DESC-2]")
    moved = 0
    if all(t.device.type == "cpu" for t in (*source.values(), *target.values())):
        # Still one copy per range, as a connector pays [DESC-3], but each is a memcpy
        # between memoryviews: no tensor is built per range. (``array.data`` is
        # ``memoryview(array)``, in a form numpy's stubs type before Python 3.12.)
        src = {name: t.numpy().data for name, t in source.items()}
        dst = {name: t.numpy().data for name, t in target.items()}
        for d in descriptors:
            dst[d.dst_region][d.dst_offset : d.dst_offset + d.length] = src[d.src_region][
                d.src_offset : d.src_offset + d.length
            ]
            moved += d.length
        return moved
    for d in descriptors:
        target[d.dst_region][d.dst_offset : d.dst_offset + d.length].copy_(
            source[d.src_region][d.src_offset : d.src_offset + d.length]
        )
        moved += d.length
    return moved
