"""Record caches: every field of a cell filled by coordinate, moved by block table, checked.

A layout whose cells are records [LAYOUT-6] — vLLM's per-token-head modes keep a
float32 scale after each of K and V, FlashMLA's fp8 record is 512 fp8 NoPE values,
4 float32 scales and 64 bfloat16 RoPE values — holds more than K and V, so the
coordinate-hash oracle [ORACLE-1] has to say what every field of a cell holds for a
receiver to check the bytes it got on its own [ORACLE-6]. Fields named ``k``, ``v``
and ``latent`` are ORACLE-1's elements; every other field is a hash of its own name
and the cell's global coordinates, and an inline scale is positive, as a scale is.

A request's fields are read out of (:func:`gather_fields`) and written into
(:func:`scatter_fields`) a paged cache by its block table exactly as K and V are
[PAGED-1..3]: token t in block ``block_ids[t // b]`` at slot ``t % b``, as bits
[DTYPE-2]; :func:`verify_fields` compares them with the oracle, field by field, bit
for bit, and names the first differing element in global coordinates [ORACLE-6].

Between caches, a record travels as rows of its bytes [LAYOUT-7] — what vLLM does when
it widens head_size to inline the scales: :func:`record_rows` lays each cell out as
one row per K/V tensor (K and its scale, then V and its scale; a latent record whole)
of one-byte elements of the cache's dtype, so a request of a record cache is a
:class:`~kvspec.tensors.kv.RequestKV` of :func:`carrier_model` that every push rule
(payload, wire, resharding, merging) moves as bits; :func:`row_fields` reads the
fields back, bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from kvspec.core.clause import Clause, must, refuses
from kvspec.memory.cache_layout import LayoutRef, get_layout
from kvspec.memory.layout_model import FIELD_DTYPES, SCALED_DTYPES, CacheLayout, Field
from kvspec.memory.paged import PagedCache, check_block_ids, check_same_scales
from kvspec.memory.planes import at_slots, check_scaled, smallest_block, unit_of
from kvspec.tensors.dtypes import FLOAT_FORMATS, bits_view, raw_bits, torch_dtype
from kvspec.tensors.kv import RequestKV, check_scales
from kvspec.tensors.oracle import (
    PRIME,
    _values,
    absorb,
    mix,
    oracle_hashes,
    oracle_kv,
    region,
    request_value,
)
from kvspec.tensors.scaled_oracle import FOUR_BIT, scaled_values, values_per_element
from kvspec.topology.model import ModelShape
from kvspec.topology.tokens import Tokens

FIELD_TAG = "kvspec/field/"
"""A field's name enters its hash as the value of the id ``kvspec/field/<name>`` [ORACLE-6]."""

ORACLE_FIELDS = {"k": 0, "v": 1, "latent": 0}
"""Fields that are ORACLE-1's elements, and the kv index each is [ORACLE-6]."""

CLAUSES = (
    Clause(
        "LAYOUT-7",
        "A record travels as its rows of bytes",
        "A request of a cache whose cells are records [LAYOUT-6] travels — in payloads, on "
        "the wire, resharded and merged [PAYLOAD-1, WIRE-1, RESHARD-3] — as rows of bytes, "
        "the way vLLM widens head_size to inline its scales: each cell's fields in record "
        "order, split into one row per K/V tensor (a packed per-token-head record at field v: "
        "K and its scale, then V and its scale; a latent record is one row), the bytes as "
        "one-byte elements of the cache's dtype. The request form is then that of the model "
        "with head_dim = a row's bytes, and every rule that moves it moves it as bits "
        "[DTYPE-2]; reading the fields back from the rows gives every field, inline scales "
        "included, bit for bit. A layout without a record (K and V travel as themselves) is "
        "refused.",
        obligations=(
            must(
                "each row is its cell's fields' bytes in record order: K and its scale, then V "
                "and its scale (a latent record: one row)"
            ),
            must("reading the fields back from the rows gives every field bit for bit"),
            refuses("a layout without a record (K and V, or a latent, travel as themselves)"),
        ),
    ),
    Clause(
        "ORACLE-6",
        "Every field of a record by coordinate",
        "A cache layout whose cells are records [LAYOUT-6] is filled field by field. Field "
        "k, v or latent of cell (layer, head, token) is ORACLE-1's K, V or latent element of "
        "that cell (kv = 0, 1 or 0; dim = the index in the field). Element i of any other "
        "field f is built as in ORACLE-2 in f's dtype from mix(seed mod P) absorbing, in "
        "order, the request value, the value of the id 'kvspec/field/' + f's name (as a "
        "request id is valued), the global layer, global head (0 for a latent), global "
        "token and i; an inline scale (a field whose name ends in 'scale') has sign 0, so "
        "it is positive. A layout that cannot hold the model (other K/V count, dtype or "
        "fixed width) is refused. Verifying a request's fields compares the raw bits of "
        "every element of every field, scales included, and names the first differing "
        "element by field, global layer, head, token and index.",
        obligations=(
            must("fields k, v and latent of a record are ORACLE-1's K, V and latent elements"),
            must(
                "element i of any other field is the hash of (seed, request, field name, layer, "
                "head, token, i) as a value of the field's dtype"
            ),
            must("an inline scale is positive"),
            must(
                "the verifier counts every element of every field whose bits differ, scales "
                "included"
            ),
            refuses("a layout that cannot hold the model (K/V count, dtype or fixed width)"),
        ),
    ),
)


def _rows(spec: CacheLayout, model: ModelShape) -> tuple[tuple[Field, ...], ...]:
    """The fields of each K/V row of a cell, in record order [LAYOUT-7].

    vLLM reads its per-token-head page the same way: the content axis is two halves of
    ``padded_hs = content // 2`` elements, ``[K(hs) | K_scale(pad) | V(hs) | V_scale(pad)]``
    with ``pad = sizeof(float32) / sizeof(cache dtype)`` (vllm 0.33.0,
    vllm/v1/attention/backends/triton_attn.py: TritonAttentionImpl._ensure_scale_caches,
    read in the installed wheel).
    """
    fields = spec.fields(model.kv_tensors)
    if model.kv_tensors == 1:
        return (fields,)
    at = [f.name for f in fields].index("v")
    return (fields[:at], fields[at:])


def carrier_model(model: ModelShape, layout: LayoutRef) -> ModelShape:
    """The model a record cache's requests travel as: ``model`` with head_dim the bytes of
    one K/V row of a cell, in one-byte elements of its dtype [LAYOUT-7].

    Every record preset is of a one-byte cache dtype with K and V rows of equal bytes; a
    hand-built layout that is not is refused here as a precondition (not a rule an
    implementation can break: no record the spec knows of reaches it).
    """
    spec = check_holds(layout, model)
    if spec.plain:
        raise ValueError(
            f"layout {spec.name} holds K and V (or a latent) and no record: they travel as "
            "themselves, not as record rows [LAYOUT-7, PAYLOAD-1]"
        )
    if FIELD_DTYPES[model.dtype].itemsize != 1:
        raise ValueError(
            f"a {spec.name} record of a {model.dtype} cache cannot travel as one-byte elements "
            "[LAYOUT-7]"
        )
    sizes = [sum(f.nbytes(model.dtype, model.head_dim) for f in row) for row in _rows(spec, model)]
    if len(set(sizes)) != 1:
        raise ValueError(
            f"a {spec.name} cell's K and V rows have {sizes} bytes; they must be equal [LAYOUT-7]"
        )
    return replace(model, head_dim=sizes[0])


def record_rows(
    fields: Mapping[str, torch.Tensor], model: ModelShape, layout: LayoutRef
) -> torch.Tensor:
    """A request's fields (each ``[layers, seq, heads, width]``) as the rows it travels as,
    ``[layers, kv, seq, heads, row bytes]`` in one-byte elements of ``model``'s dtype: each
    row its fields' bytes in record order, K's value and scale, then V's [LAYOUT-7]."""
    spec = get_layout(layout)
    carrier = carrier_model(model, spec)
    rows = []
    for row in _rows(spec, model):
        missing = [f.name for f in row if f.name not in fields]
        if missing:
            raise ValueError(f"fields {missing} of a {spec.name} cell are missing [LAYOUT-7]")
        rows.append(torch.cat([fields[f.name].contiguous().view(torch.uint8) for f in row], -1))
    data = torch.stack(rows, dim=1)
    assert data.shape[-1] == carrier.head_dim
    return data.view(torch_dtype(model.dtype))


def row_fields(rows: torch.Tensor, model: ModelShape, layout: LayoutRef) -> dict[str, torch.Tensor]:
    """The fields of rows ``[layers, kv, seq, heads, row bytes]``, each ``[layers, seq, heads,
    width]`` in its own dtype, bit for bit [LAYOUT-7]."""
    spec = get_layout(layout)
    carrier = carrier_model(model, spec)
    if rows.dim() != 5 or rows.shape[1] != model.kv_tensors or rows.shape[-1] != carrier.head_dim:
        raise ValueError(
            f"rows of shape {list(rows.shape)} are not {spec.name} rows of {model.describe()}: "
            f"expected [layers, {model.kv_tensors}, seq, heads, {carrier.head_dim}] [LAYOUT-7]"
        )
    return split_rows(rows, _rows(spec, model), model)


def split_rows(
    rows: torch.Tensor, order: Sequence[Sequence[Field]], model: ModelShape
) -> dict[str, torch.Tensor]:
    """Cut rows ``[layers, kv, seq, heads, row bytes]`` into fields, row ``k`` holding the
    fields ``order[k]`` back to back, each viewed in its own dtype [LAYOUT-7]."""
    raw = rows.view(torch.uint8)
    out: dict[str, torch.Tensor] = {}
    for k, row in enumerate(order):
        at = 0
        for f in row:
            dtype, _ = f.resolve(model.dtype, model.head_dim)
            size = f.nbytes(model.dtype, model.head_dim)
            out[f.name] = raw[:, k, ..., at : at + size].contiguous().view(FIELD_DTYPES[dtype])
            at += size
    return out


def gather_rows(
    cache: PagedCache, model: ModelShape, block_ids: Sequence[int] | torch.Tensor, seq_len: int
) -> RequestKV:
    """A request of a record cache as the rows it travels as, with the cache's fp8 scales
    [LAYOUT-7, PAGED-4]: a :class:`RequestKV` of :func:`carrier_model`."""
    rows = record_rows(gather_fields(cache, block_ids, seq_len), model, cache.layout)
    return RequestKV(rows, None if cache.scales is None else cache.scales.clone())


def scatter_rows(
    kv: RequestKV, cache: PagedCache, model: ModelShape, block_ids: Sequence[int] | torch.Tensor
) -> None:
    """Write a request's rows into a record cache's blocks, every field bit for bit; its
    scales must be the cache's [LAYOUT-7, PAGED-5]."""
    where = f"record rows scattered into a paged {cache.dtype} cache"
    check_scales(
        kv.scales, cache.dtype, layers=cache.num_layers, kv_tensors=model.kv_tensors, where=where
    )
    if cache.scales is not None and kv.scales is not None:
        check_same_scales(kv.scales, cache.scales)
    scatter_fields(row_fields(kv.data.to(cache.device), model, cache.layout), cache, block_ids)


def check_holds(layout: LayoutRef, model: ModelShape) -> CacheLayout:
    """The layout, if its cells can hold ``model``'s cache; else refused [ORACLE-6, LAYOUT-5]."""
    spec = get_layout(layout).layer_layout
    if spec.kv_tensors not in (model.kv_tensors, None):
        holds = "K and V" if spec.kv_tensors == 2 else "one latent"
        raise ValueError(
            f"layout {spec.name} holds {holds} per layer; {model.describe()} does not "
            "[ORACLE-6, LAYOUT-3]"
        )
    if spec.dtypes is not None and model.dtype not in spec.dtypes:
        raise ValueError(
            f"layout {spec.name} holds {', '.join(spec.dtypes)} caches, not {model.dtype} "
            "[ORACLE-6, LAYOUT-5]"
        )
    if spec.fixed_head_dim is not None and model.head_dim != spec.fixed_head_dim:
        raise ValueError(
            f"layout {spec.name} holds a latent of {spec.fixed_head_dim}, not "
            f"{model.head_dim} [ORACLE-6, LAYOUT-5]"
        )
    for f in spec.fields(model.kv_tensors):
        dtype, _ = f.resolve(model.dtype, model.head_dim)  # refuses a head_dim off head_dim/N
        if dtype not in FLOAT_FORMATS and dtype not in SCALED_DTYPES:
            raise ValueError(
                f"layout {spec.name}: field {f.name} is {dtype}, which the oracle has no "
                "values for [ORACLE-6, ORACLE-2]"
            )
        if f.name in ORACLE_FIELDS and dtype not in (model.dtype, FOUR_BIT):
            raise ValueError(
                f"layout {spec.name}: field {f.name} is {dtype}; ORACLE-1's {f.name} of a "
                f"{model.dtype} model is {model.dtype}, or fp4 packed [ORACLE-6, ORACLE-8]"
            )
    if spec.scaled:
        check_scaled(spec, model.dtype, smallest_block(spec), model.head_dim)
    return spec


def cell_bytes(layout: LayoutRef, model: ModelShape) -> int:
    """Bytes of one (layer, token, head) cell: every field of every part [LAYOUT-6]."""
    return check_holds(layout, model).cell_bytes(model.dtype, model.head_dim, model.kv_tensors)


def _axis(values: Sequence[int], dim: int, device: torch.device) -> torch.Tensor:
    shape = [1, 1, 1, 1]
    shape[dim] = len(values)
    return torch.tensor(list(values), dtype=torch.int64, device=device).view(shape)


def record_fill(
    model: ModelShape,
    layout: LayoutRef,
    request_id: str,
    *,
    tokens: range | Tokens | int,
    layers: range | None = None,
    heads: range | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Every field of the cells of a region of one request [ORACLE-6].

    Each field is ``[layers, tokens, heads, width]`` in its own dtype, in the order the
    layout's cells hold them; ``tokens`` is a range, a token set or a seq_len [ORACLE-4].
    """
    spec = check_holds(layout, model)
    where = region(model, tokens=tokens, layers=layers, heads=heads)
    device = torch.device(device)
    fields = spec.fields(model.kv_tensors)
    out: dict[str, torch.Tensor] = {}
    kv = None
    wanted: dict[str, Any] = {  # the region asked for, as the oracle takes it
        "tokens": where.tokens,
        "layers": where.layers,
        "heads": where.heads,
        "seed": seed,
        "device": device,
    }
    packed = any(
        f.name in ORACLE_FIELDS and f.resolve(model.dtype, model.head_dim)[0] == FOUR_BIT
        for f in fields
    )
    if packed:  # ORACLE-1's hashes, as fp4 values [ORACLE-8.3]
        kv = scaled_values(oracle_hashes(model, request_id, **wanted), FOUR_BIT)
    elif any(f.name in ORACLE_FIELDS for f in fields):
        kv = oracle_kv(model, request_id, **wanted).data
    start = absorb(mix(seed % PRIME), request_value(request_id))
    for f in fields:
        dtype, width = f.resolve(model.dtype, model.head_dim)
        if f.name in ORACLE_FIELDS:
            assert kv is not None
            out[f.name] = kv[:, ORACLE_FIELDS[f.name]]
            continue
        named = absorb(start, request_value(FIELD_TAG + f.name))
        values = width * values_per_element(dtype)  # fp4: two values a byte [ORACLE-8]
        h = torch.full((1, 1, 1, 1), named, dtype=torch.int64, device=device)
        h = absorb(h, _axis(where.layers, 0, device))
        h = absorb(h, _axis(where.heads, 2, device))
        h = absorb(h, _axis(where.token_list(), 1, device))
        h = absorb(h, _axis(range(values), 3, device))
        shape = (len(where.layers), where.token_count, len(where.heads), values)
        if dtype in SCALED_DTYPES:
            out[f.name] = scaled_values(h.expand(shape).contiguous(), dtype)
        else:
            out[f.name] = _values(h.expand(shape).contiguous(), dtype, positive=f.is_scale)
    return out


def _token_index(
    cache: PagedCache, block_ids: Sequence[int] | torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, slot) of each token of the request [PAGED-1], ids checked [PAGED-2, PAGED-3]."""
    shape = cache.shape
    ids = check_block_ids(
        block_ids, num_blocks=shape.num_blocks, block_size=shape.block_size, seq_len=seq_len
    )
    table = torch.tensor(ids, dtype=torch.long, device=cache.device)
    t = torch.arange(seq_len, dtype=torch.long, device=cache.device)
    return table[t // shape.block_size], t % shape.block_size


def gather_fields(
    cache: PagedCache, block_ids: Sequence[int] | torch.Tensor, seq_len: int
) -> dict[str, torch.Tensor]:
    """Every field of the request's cells, ``[layers, seq_len, heads, width]`` each, copied
    out of ``cache`` as bits [PAGED-1, LAYOUT-6, DTYPE-2]."""
    blocks, slots = _token_index(cache, block_ids, seq_len)
    spec = cache.layout
    per_layer = [cache.fields(layer) for layer in cache.layers]
    return {
        name: torch.stack(
            [views[name][at_slots(unit_of(spec, name), blocks, slots)] for views in per_layer]
        )
        for name in per_layer[0]
    }


def scatter_fields(
    fields: Mapping[str, torch.Tensor], cache: PagedCache, block_ids: Sequence[int] | torch.Tensor
) -> None:
    """Write every field of a request's cells into ``cache``'s blocks, as bits; only the
    request's slots change, and everything is checked before anything is written
    [PAGED-1..3, LAYOUT-6]."""
    per_layer = [cache.fields(layer) for layer in cache.layers]
    if set(fields) != set(per_layer[0]):
        raise ValueError(
            f"a {cache.layout.name} cell holds the fields {', '.join(per_layer[0])}; got "
            f"{', '.join(fields)} [LAYOUT-6]"
        )
    seq_len = None
    for name, data in fields.items():
        view = per_layer[0][name]
        want = [len(per_layer), None, *view.shape[-2:]]
        if data.dim() != 4 or [w for w in want if w is not None] != [
            n for w, n in zip(want, data.shape, strict=True) if w is not None
        ]:
            raise ValueError(
                f"field {name} of shape {list(data.shape)} does not fit a "
                f"{cache.layout.name} cache: "
                f"expected [layers, seq, heads, width] = "
                f"{['seq' if w is None else w for w in want]} [LAYOUT-6]"
            )
        if data.dtype != view.dtype:
            raise ValueError(
                f"field {name} is {data.dtype}, the cache's is {view.dtype} [LAYOUT-6]"
            )
        if seq_len not in (None, data.shape[1]):
            raise ValueError(f"the fields disagree on seq_len: {name} has {data.shape[1]} tokens")
        seq_len = data.shape[1]
    assert seq_len is not None
    blocks, slots = _token_index(cache, block_ids, seq_len)
    spec = cache.layout
    for layer, views in enumerate(per_layer):
        for name, data in fields.items():
            at = at_slots(unit_of(spec, name), blocks, slots)
            bits_view(views[name])[at] = bits_view(data[layer].to(cache.device))


@dataclass(frozen=True)
class FieldMismatch:
    """The first element of a field that differs from the oracle [ORACLE-6]."""

    field: str
    layer: int
    head: int
    token: int
    index: int
    expected_bits: int
    got_bits: int


@dataclass(frozen=True)
class FieldVerdict:
    """The result of checking a request's fields against the oracle [ORACLE-6]."""

    request_id: str
    total: int
    mismatches: int
    first: FieldMismatch | None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    @property
    def message(self) -> str:
        head = f"request {self.request_id!r}"
        if self.ok:
            return f"{head}: all {self.total} field elements match the oracle bit for bit"
        f = self.first
        assert f is not None
        return (
            f"{head}: {self.mismatches} of {self.total} field elements differ from the oracle; "
            f"first {f.field}[{f.index}] at layer {f.layer}, head {f.head}, token {f.token}: "
            f"expected bits 0x{f.expected_bits:x}, got 0x{f.got_bits:x} [ORACLE-6]"
        )


def verify_fields(
    fields: Mapping[str, torch.Tensor],
    model: ModelShape,
    layout: LayoutRef,
    request_id: str,
    *,
    tokens: range | Tokens | int,
    layers: range | None = None,
    heads: range | None = None,
    seed: int = 0,
) -> FieldVerdict:
    """Compare every field of a region's cells with the oracle, bit for bit [ORACLE-6].

    Fields missing, extra, or of another shape or dtype than the region implies are refused.
    """
    where = region(model, tokens=tokens, layers=layers, heads=heads)
    device = next(iter(fields.values())).device if fields else torch.device("cpu")
    want = record_fill(
        model,
        layout,
        request_id,
        tokens=where.tokens,
        layers=where.layers,
        heads=where.heads,
        seed=seed,
        device=device,
    )
    if set(fields) != set(want):
        raise ValueError(
            f"fields {sorted(fields)} are not the fields of a {get_layout(layout).name} cell, "
            f"{list(want)} [ORACLE-6]"
        )
    total = mismatches = 0
    first = None
    for name, expected in want.items():
        got = fields[name]
        if got.shape != expected.shape or got.dtype != expected.dtype:
            raise ValueError(
                f"field {name} under verification is {got.dtype} {list(got.shape)}; the region "
                f"implies {expected.dtype} {list(expected.shape)} [ORACLE-6]"
            )
        a, b = raw_bits(expected), raw_bits(got)
        differs = a != b
        count = int(differs.sum())
        total += differs.numel()
        if count and first is None:
            layer, token, head, index = (int(i) for i in differs.nonzero()[0].tolist())
            mask = (1 << (8 * expected.element_size())) - 1
            first = FieldMismatch(
                name,
                where.layers[layer],
                where.heads[head],
                where.token_list()[token],
                index,
                int(a[layer, token, head, index]) & mask,
                int(b[layer, token, head, index]) & mask,
            )
        mismatches += count
    return FieldVerdict(request_id, total, mismatches, first)
