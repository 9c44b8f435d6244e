"""Attention-backend cache layouts: named, read as views, converted, detected only when unambiguous.

An engine keeps one layer's KV cache in a backend-specific layout [LAYOUT-1]. The spec
reads every layout into the same per-tensor form — for K and V (or the MLA latent), a
view ``[num_blocks, block_size, heads, head_dim]`` of the cache's own storage
[LAYOUT-2] — so that gathering, scattering and converting [LAYOUT-3] are written
once. Which layout a cache is in is stated by name; :func:`detect_layout` answers from
the shape only when exactly one layout fits and otherwise asks for the name [LAYOUT-4].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from kvspec._checks import require_int
from kvspec.clause import Clause, must, refuses
from kvspec.tensors.dtypes import bits_view, dtype_name, torch_dtype

CLAUSES = (
    Clause(
        "LAYOUT-1",
        "Named cache layouts",
        "A layer's cache is read and written only under a named layout: flash_attn "
        "[2, num_blocks, block_size, heads, head_dim]; flash_attn_hnd [2, num_blocks, heads, "
        "block_size, head_dim]; flashinfer [num_blocks, 2, block_size, heads, head_dim]; "
        "flashinfer_hnd [num_blocks, 2, heads, block_size, head_dim]; kv_tuple (K, V), each "
        "[num_blocks, block_size, heads, head_dim]; mla [num_blocks, block_size, latent]; "
        "token_major (K, V), each [seq, heads, head_dim], or (latent,) as [seq, 1, latent] — "
        "the request form a payload carries. Index 0 of a K/V axis or tuple is K. An unknown "
        "name is refused listing the known ones; a cache whose tensors do not have the "
        "named layout's rank, K/V axis of size 2, equal K and V shapes, dtypes and devices, "
        "an allowed dtype [DTYPE-1], or the heads, head_dim or block_size the caller states, "
        "is refused with its shape.",
        obligations=(
            must(
                "each named layout reads K at index 0 and V at index 1 of its K/V axis or tuple, "
                "and blocks, slots, heads and head_dim from its own axes"
            ),
            refuses("an unknown layout name"),
            refuses(
                "a cache without the named layout's rank, K/V axis of size 2, or equal K and V "
                "shapes"
            ),
        ),
    ),
    Clause(
        "LAYOUT-2",
        "Reading a cache is a view",
        "Reading a layer's cache gives, for K and V (or the latent), a tensor [num_blocks, "
        "block_size, heads, head_dim] that is a view of the cache's own storage: no element "
        "is copied and writing through the view writes the cache. MLA reads as heads = 1, "
        "head_dim = latent [MODEL-2]; token_major reads as num_blocks = seq and "
        "block_size = 1, i.e. block i holds token i.",
        obligations=(
            must("reading a cache returns views of its storage: nothing is copied"),
            must(
                "token_major reads as one token per block (block_size 1), MLA as one head of the "
                "latent's width"
            ),
        ),
    ),
    Clause(
        "LAYOUT-3",
        "Conversion moves every slot, bit for bit",
        "Two layouts carry the same information when they hold the same number of tensors "
        "per layer (K and V, or one latent). Converting between them puts slot s of each "
        "tensor (s = block * block_size + offset, blocks in order) at slot s of the target, "
        "bit-equal [DTYPE-2]; the target's block size may differ when it divides the number "
        "of slots (token_major has block size 1). The result is a new cache that shares no "
        "storage with the input. A conversion between layouts that carry different "
        "information (K/V to a latent), or to a block size that does not divide the slots, "
        "is refused: nothing is dropped or padded.",
        obligations=(
            must(
                "conversion puts slot s of K and V (or the latent) at slot s of the target, "
                "bit for bit"
            ),
            must(
                "the converted cache shares no storage with the input, even when the layout is the "
                "same"
            ),
            refuses(
                "a conversion between layouts that carry different information (K and V to a "
                "latent)"
            ),
        ),
    ),
    Clause(
        "LAYOUT-4",
        "Detection answers only when unambiguous",
        "Given a cache and what the caller knows of it (heads, head_dim, block_size; each "
        "optional, and each narrows the answer), layout detection returns the one layout "
        "whose shape the cache fits. When several fit — a stacked cache with exactly 2 "
        "blocks fits both flash_attn and flashinfer; a head count equal to block_size (or "
        "an unstated one) fits both an NHD and an HND variant — it refuses, listing every "
        "candidate with the num_blocks, block_size and heads it would read, and asks for "
        "the layout by name. When none fits it refuses, listing the layouts' shapes. It "
        "never guesses, and never reads strides.",
        obligations=(
            must("when exactly one layout fits, detection names it"),
            refuses("a shape that fits several layouts (two blocks; heads equal to block_size)"),
            must("each stated fact (heads, head_dim, block_size) narrows the candidates"),
            refuses("a cache no layout fits, including one that contradicts a stated fact"),
        ),
    ),
)

LayerCache = torch.Tensor | tuple[torch.Tensor, ...]
"""One layer's cache as an engine holds it: one tensor, or a tuple of tensors [LAYOUT-1]."""

# The per-tensor form every layout is read into [LAYOUT-2]: blocks, slots in a block,
# heads, head_dim. A layout names its axes in this vocabulary, plus "kv" for a K/V axis.
_CANONICAL = ("blocks", "slots", "heads", "dim")


@dataclass(frozen=True)
class CacheLayout:
    """A named cache layout [LAYOUT-1].

    ``axes`` names the axes of each stored tensor (``kv`` is the K/V axis of a stacked
    layout); ``kv_tensors`` is 2 (K and V), 1 (a latent), or ``None`` for token_major,
    which holds whichever its tuple has. ``tuple_form`` layouts keep one tensor per K/V.
    """

    name: str
    shape: str
    axes: tuple[str, ...]
    kv_tensors: int | None
    tuple_form: bool

    @property
    def kv_axis(self) -> int | None:
        return self.axes.index("kv") if "kv" in self.axes else None

    @property
    def paged(self) -> bool:
        """False for token_major, whose block size is always 1 [LAYOUT-2]."""
        return "slots" in self.axes


LAYOUTS: dict[str, CacheLayout] = {
    layout.name: layout
    for layout in (
        CacheLayout(
            "flash_attn",
            "[2, num_blocks, block_size, heads, head_dim]",
            ("kv", "blocks", "slots", "heads", "dim"),
            2,
            False,
        ),
        CacheLayout(
            "flash_attn_hnd",
            "[2, num_blocks, heads, block_size, head_dim]",
            ("kv", "blocks", "heads", "slots", "dim"),
            2,
            False,
        ),
        CacheLayout(
            "flashinfer",
            "[num_blocks, 2, block_size, heads, head_dim]",
            ("blocks", "kv", "slots", "heads", "dim"),
            2,
            False,
        ),
        CacheLayout(
            "flashinfer_hnd",
            "[num_blocks, 2, heads, block_size, head_dim]",
            ("blocks", "kv", "heads", "slots", "dim"),
            2,
            False,
        ),
        CacheLayout(
            "kv_tuple",
            "(K, V), each [num_blocks, block_size, heads, head_dim]",
            ("blocks", "slots", "heads", "dim"),
            2,
            True,
        ),
        CacheLayout(
            "mla", "[num_blocks, block_size, latent]", ("blocks", "slots", "dim"), 1, False
        ),
        CacheLayout(
            "token_major",
            "(K, V), each [seq, heads, head_dim]; MLA: (latent,) as [seq, 1, latent]",
            ("blocks", "heads", "dim"),
            None,
            True,
        ),
    )
}
"""Every named layout [LAYOUT-1], in the order candidates are listed."""


def get_layout(name: object) -> CacheLayout:
    """The layout called ``name``; unknown names are refused with the known ones [LAYOUT-1]."""
    if isinstance(name, CacheLayout):
        return name
    if name not in LAYOUTS:
        raise ValueError(
            f"unknown cache layout {name!r}; the layouts are {', '.join(LAYOUTS)} [LAYOUT-1]"
        )
    return LAYOUTS[name]  # type: ignore[index]


def layouts_for(attention: str) -> tuple[str, ...]:
    """The layouts that can hold a model of attention kind ``attention`` ('mha' or 'mla')."""
    kv = 1 if attention == "mla" else 2
    return tuple(n for n, layout in LAYOUTS.items() if layout.kv_tensors in (kv, None))


@dataclass(frozen=True)
class CacheShape:
    """What a layer's cache holds, independent of its layout [LAYOUT-2].

    ``kv`` tensors (2: K and V; 1: a latent), each of ``num_blocks`` blocks of
    ``block_size`` slots, ``heads`` heads and ``head_dim`` elements per head.
    """

    kv: int
    num_blocks: int
    block_size: int
    heads: int
    head_dim: int

    def __post_init__(self) -> None:
        require_int("kv", self.kv, minimum=1)
        require_int("num_blocks", self.num_blocks, minimum=0)
        require_int("block_size", self.block_size, minimum=1)
        require_int("heads", self.heads, minimum=1)
        require_int("head_dim", self.head_dim, minimum=1)
        if self.kv not in (1, 2):
            raise ValueError(f"kv must be 2 (K and V) or 1 (an MLA latent), got {self.kv}")
        if self.kv == 1 and self.heads != 1:
            raise ValueError(
                f"a latent cache (kv=1) has no head axis, so heads must be 1, got {self.heads} "
                "[MODEL-2]"
            )

    @property
    def slots(self) -> int:
        """Token slots per tensor: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size


def describe_cache(cache: object) -> str:
    """A cache's structure for error messages: a shape, or a tuple of shapes."""
    if isinstance(cache, torch.Tensor):
        return f"tensor of shape {list(cache.shape)}"
    if isinstance(cache, (tuple, list)):
        parts = [
            str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in cache
        ]
        return f"tuple of {len(parts)} ({', '.join(parts)})"
    return f"{type(cache).__name__} (neither a tensor nor a tuple of tensors)"


def _tensors(cache: object, layout: CacheLayout) -> tuple[torch.Tensor, ...]:
    """The stored tensors of ``cache``, refusing the wrong container for ``layout`` [LAYOUT-1]."""
    where = f"{layout.name} cache {layout.shape}"
    if layout.tuple_form:
        counts = (2,) if layout.kv_tensors == 2 else (1, 2)
        if (
            not isinstance(cache, (tuple, list))
            or len(cache) not in counts
            or not all(isinstance(t, torch.Tensor) for t in cache)
        ):
            wanted = " or ".join(str(c) for c in counts)
            raise ValueError(
                f"a {where} is a tuple of {wanted} tensors; got {describe_cache(cache)} [LAYOUT-1]"
            )
        tensors = tuple(cache)
    else:
        if not isinstance(cache, torch.Tensor):
            raise ValueError(f"a {where} is one tensor; got {describe_cache(cache)} [LAYOUT-1]")
        tensors = (cache,)
    first = tensors[0]
    for t in tensors:
        if t.dim() != len(layout.axes):
            raise ValueError(
                f"a {where} has {len(layout.axes)}-d tensors; got {describe_cache(cache)} "
                "[LAYOUT-1]"
            )
        if t.shape != first.shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                f"K and V of a {where} must agree in shape, dtype and device; got "
                f"{[(list(x.shape), str(x.dtype), str(x.device)) for x in tensors]} [LAYOUT-1]"
            )
    dtype_name(first.dtype)  # refuses dtypes outside DTYPE-1
    return tensors


def cache_shape(
    cache: LayerCache,
    layout: str | CacheLayout,
    *,
    heads: int | None = None,
    head_dim: int | None = None,
    block_size: int | None = None,
) -> CacheShape:
    """What ``cache`` holds when read as ``layout``; refuses a cache that does not fit [LAYOUT-1].

    ``heads``, ``head_dim`` and ``block_size``, when given, must match; token_major's block
    size is 1 [LAYOUT-2].
    """
    spec = get_layout(layout)
    tensors = _tensors(cache, spec)
    sizes = dict(zip(spec.axes, tensors[0].shape, strict=True))
    if spec.kv_axis is not None and sizes["kv"] != 2:
        raise ValueError(
            f"a {spec.name} cache {spec.shape} has a K/V axis of size 2 at dim {spec.kv_axis}; "
            f"got {describe_cache(cache)} [LAYOUT-1]"
        )
    kv = sizes.get("kv", len(tensors) if spec.tuple_form else 1)
    if kv == 1 and "heads" in sizes and sizes["heads"] != 1:
        raise ValueError(
            f"a {spec.name} cache with one tensor holds an MLA latent, which has one head; got "
            f"{describe_cache(cache)} with {sizes['heads']} heads [LAYOUT-1, MODEL-2]"
        )
    shape = CacheShape(
        kv=kv,
        num_blocks=sizes["blocks"],
        block_size=sizes.get("slots", 1),
        heads=sizes.get("heads", 1),
        head_dim=sizes["dim"],
    )
    stated = {"heads": heads, "head_dim": head_dim, "block_size": block_size}
    wrong = [
        f"{name} {getattr(shape, name)} != stated {value}"
        for name, value in stated.items()
        if value is not None and getattr(shape, name) != value
    ]
    if wrong:
        raise ValueError(
            f"{describe_cache(cache)} read as {spec.name} {spec.shape} has "
            f"{'; '.join(wrong)} [LAYOUT-1]"
        )
    return shape


def _canonical(tensor: torch.Tensor, axes: Sequence[str]) -> torch.Tensor:
    """Permute ``tensor`` to [blocks, slots, heads, dim], inserting size-1 axes it lacks."""
    view = tensor.permute([axes.index(a) for a in _CANONICAL if a in axes])
    for i, axis in enumerate(_CANONICAL):
        if axis not in axes:
            view = view.unsqueeze(i)
    return view


def kv_views(cache: LayerCache, layout: str | CacheLayout) -> tuple[torch.Tensor, ...]:
    """K and V (or the latent) of ``cache``, each a view [LAYOUT-2].

    Each is ``[num_blocks, block_size, heads, head_dim]``; nothing is copied: every
    returned tensor shares the cache's storage.
    """
    spec = get_layout(layout)
    cache_shape(cache, spec)
    if spec.kv_axis is not None:
        assert isinstance(cache, torch.Tensor)
        axes = [a for a in spec.axes if a != "kv"]
        return tuple(_canonical(cache.select(spec.kv_axis, k), axes) for k in range(2))
    tensors = tuple(cache) if spec.tuple_form else (cache,)  # type: ignore[arg-type]
    return tuple(_canonical(t, spec.axes) for t in tensors)


def empty_cache(
    layout: str | CacheLayout, shape: CacheShape, dtype: str, device: str | torch.device = "cpu"
) -> LayerCache:
    """A zero-filled cache of ``shape`` in ``layout`` [LAYOUT-1]."""
    return _allocate(get_layout(layout), shape, dtype, device, torch.zeros)


def _allocate(
    spec: CacheLayout,
    shape: CacheShape,
    dtype: str,
    device: str | torch.device,
    factory: Callable[..., torch.Tensor],
) -> LayerCache:
    _check_holds(spec, shape)
    sizes = {
        "kv": shape.kv,
        "blocks": shape.num_blocks,
        "slots": shape.block_size,
        "heads": shape.heads,
        "dim": shape.head_dim,
    }
    dims = [sizes[a] for a in spec.axes]
    tensors = [
        factory(dims, dtype=torch_dtype(dtype), device=device)
        for _ in range(shape.kv if spec.tuple_form else 1)
    ]
    return tuple(tensors) if spec.tuple_form else tensors[0]


def _check_holds(spec: CacheLayout, shape: CacheShape) -> None:
    """Refuse a shape the layout cannot hold: other K/V count, or token_major blocks [LAYOUT-3]."""
    if spec.kv_tensors is not None and spec.kv_tensors != shape.kv:
        have = "K and V" if shape.kv == 2 else "one latent"
        holds = "K and V" if spec.kv_tensors == 2 else "one latent"
        raise ValueError(
            f"layout {spec.name} {spec.shape} holds {holds} per layer but the cache holds "
            f"{have}: they do not carry the same information; use one of "
            f"{', '.join(layouts_for('mha' if shape.kv == 2 else 'mla'))} [LAYOUT-3]"
        )
    if not spec.paged and shape.block_size != 1:
        raise ValueError(
            f"layout {spec.name} has block size 1 (block i is token i), not {shape.block_size} "
            "[LAYOUT-2, LAYOUT-3]"
        )


def convert(
    cache: LayerCache,
    source: str | CacheLayout,
    target: str | CacheLayout,
    *,
    block_size: int | None = None,
) -> LayerCache:
    """``cache`` (in ``source``) as a new cache in ``target``, bit for bit [LAYOUT-3].

    ``block_size`` is the target's block size: by default the source's (1 from token_major,
    and always 1 into token_major). Slot ``s`` of K and V stays slot ``s``.
    """
    src, dst = get_layout(source), get_layout(target)
    shape = cache_shape(cache, src)
    if block_size is None:
        block_size = shape.block_size if dst.paged else 1
    require_int("block_size", block_size, minimum=1)
    if shape.slots % block_size:
        raise ValueError(
            f"cannot re-block {shape.num_blocks} blocks of {shape.block_size} slots "
            f"({shape.slots} slots) into blocks of {block_size}: {block_size} does not divide "
            f"{shape.slots}, and slots are never dropped or padded [LAYOUT-3]"
        )
    out_shape = replace(shape, num_blocks=shape.slots // block_size, block_size=block_size)
    _check_holds(dst, out_shape)
    views = kv_views(cache, src)
    # Uninitialised is safe: every slot of the target is written below.
    out = _allocate(dst, out_shape, dtype_name(views[0].dtype), views[0].device, torch.empty)
    for have, want in zip(views, kv_views(out, dst), strict=True):
        _copy_slots(bits_view(have), bits_view(want))  # bits, not values [DTYPE-2]
    return out


def _copy_slots(have: torch.Tensor, want: torch.Tensor) -> None:
    """Copy slot s of ``have`` to slot s of ``want``, both [blocks, slots, heads, dim] [LAYOUT-3].

    Their block sizes may differ: the target is viewed in the source's blocks where its
    strides allow, so re-blocking costs no extra copy; otherwise the source is reshaped.
    """
    try:
        target = want.view(have.shape)
    except RuntimeError:
        target, have = want, have.reshape(want.shape)
    target.copy_(have)


def detect_layout(
    cache: LayerCache,
    *,
    heads: int | None = None,
    head_dim: int | None = None,
    block_size: int | None = None,
) -> str:
    """The one layout ``cache`` fits, given what is known of it [LAYOUT-4].

    Refuses, listing the candidates, when several layouts fit, and when none does.
    ``heads``, ``head_dim`` and (for paged layouts) ``block_size`` narrow the candidates;
    state all that is known.
    """
    stated = {"heads": heads, "head_dim": head_dim, "block_size": block_size}
    for name, value in stated.items():
        if value is not None:
            require_int(name, value, minimum=1)
    tensors = cache if isinstance(cache, (tuple, list)) else (cache,)
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            dtype_name(tensor.dtype)  # a disallowed dtype is named as such [DTYPE-1]
    fits: list[tuple[str, CacheShape]] = []
    for name, spec in LAYOUTS.items():
        try:
            shape = cache_shape(
                cache,
                spec,
                heads=heads,
                head_dim=head_dim,
                block_size=block_size if spec.paged else None,
            )
        except ValueError:
            continue
        fits.append((name, shape))
    known = ", ".join(f"{k}={v}" for k, v in stated.items() if v is not None)
    given = f"a {describe_cache(cache)}" + (f" with {known}" if known else "")
    if len(fits) == 1:
        return fits[0][0]
    if not fits:
        shapes = "; ".join(f"{n} {spec.shape}" for n, spec in LAYOUTS.items())
        raise ValueError(f"{given} fits no cache layout; the layouts are: {shapes} [LAYOUT-4]")
    readings = "; ".join(
        f"{n} (num_blocks={s.num_blocks}, block_size={s.block_size}, heads={s.heads})"
        for n, s in fits
    )
    raise ValueError(
        f"{given} is ambiguous: it fits {len(fits)} layouts: {readings}. The shape cannot "
        f"tell them apart, so name the layout (one of {', '.join(repr(n) for n, _ in fits)}) "
        "[LAYOUT-4]"
    )
