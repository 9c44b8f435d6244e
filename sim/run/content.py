"""What a run's caches hold, chosen once per run: plain KV, record rows or layer-group parts.

- ``kv``: K and V (or a latent) in cells the oracle fills tensor by tensor [ORACLE-4];
- ``records``: cells that are records with inline scales or a fixed format, every field
  filled and checked [LAYOUT-6, ORACLE-6] and pushed as rows of bytes [LAYOUT-7];
- ``groups``: a hybrid model's layer groups, each planned, cut and landed group by group
  [GROUP-1, GROUP-3, STATE-2] (:mod:`kvspec.tensors.group_reshard`).

Every part of a rank that treats content differently asks :attr:`SimConfig.content
<sim.run.config.SimConfig.content>`, never the layouts or the model again, so the three
kinds cannot be told apart in two places two ways.
"""

from __future__ import annotations

from typing import Literal

from kvspec.memory.layout_model import CacheLayout
from kvspec.topology.model import ModelShape

ContentKind = Literal["kv", "records", "groups"]
CONTENT_KINDS: tuple[ContentKind, ...] = ("kv", "records", "groups")


def content_kind(
    model: ModelShape, src_layout: CacheLayout, dst_layout: CacheLayout
) -> ContentKind:
    """The content kind of a run of ``model`` between caches of these two layouts: a model
    with layer groups or an indexer moves as group parts [GROUP-3]; a cache whose cells are
    not plain K and V as record rows [LAYOUT-6]; anything else as plain KV."""
    if model.hybrid:
        return "groups"
    if not (src_layout.plain and dst_layout.plain):
        return "records"
    return "kv"
