"""The model facts a KV transfer depends on, and the rule that both stages agree on them.

MLA is modelled as a single latent "head" whose width is the latent width: it has no
head axis to split, so every TP rank holds all of it [MODEL-2, HEAD-3]. That one
choice lets the head-ownership and plan rules treat MHA, GQA and MLA alike; only the
byte count (one tensor per layer instead of K and V) and the cache layout differ.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.dtype_names import FP8_DTYPES, check_dtype, itemsize
from kvspec.core.forms import dataclass_form
from kvspec.core.require import require_choice, require_int
from kvspec.topology.groups import FullAttention, LayerGroup, group_from_dict
from kvspec.topology.indexer import check_indexer

CLAUSES = (
    Clause(
        "MODEL-1",
        "Model shape",
        "A model shape has num_layers >= 1, num_kv_heads >= 1, head_dim >= 1, an attention "
        "kind ('mha' covers MHA and GQA, by head count; or 'mla') and a cache dtype "
        "[DTYPE-1]. An fp8 dtype carries a scale format ('per_layer': one float32 scale for "
        "K and one for V per layer); other dtypes carry none.",
        obligations=(
            refuses("num_layers, num_kv_heads or head_dim below 1, or not an integer"),
            refuses("an attention kind other than 'mha' or 'mla'"),
            refuses(
                "an fp8 dtype with a scale format other than 'per_layer', or another dtype with a "
                "scale format"
            ),
        ),
    ),
    Clause(
        "MODEL-2",
        "MLA is one latent per token",
        "An MLA cache holds one latent vector of width latent_dim per token and layer, with "
        "no head axis and no separate V. It is described as num_kv_heads = 1 and "
        "head_dim = latent_dim; any other head count is refused.",
        obligations=(
            must("an MLA latent (one tensor per layer, no V, no head axis) moves intact"),
            refuses("an MLA model with num_kv_heads other than 1"),
        ),
    ),
    Clause(
        "MODEL-3",
        "Both stages agree on the model",
        "A transfer is refused before any byte moves unless the two stages agree on "
        "num_layers, num_kv_heads, head_dim, attention kind, cache dtype and fp8 scale "
        "format. The error lists every mismatch, not only the first. Block size and cache "
        "layout may differ: they are converted.",
        obligations=(
            refuses("stages that differ in num_layers alone"),
            refuses("stages that differ in num_kv_heads alone"),
            refuses("stages that differ in head_dim alone"),
            refuses("stages that differ in attention kind alone"),
            refuses("stages that differ in cache dtype alone (even of one itemsize)"),
        ),
    ),
)

Attention = Literal["mha", "mla"]
ATTENTION_KINDS: tuple[str, ...] = ("mha", "mla")
SCALE_FORMATS: tuple[str, ...] = ("per_layer",)


@dataclass(frozen=True)
class ModelShape:
    """The model facts that shape a KV cache [MODEL-1, MODEL-2].

    >>> ModelShape(num_layers=32, num_kv_heads=8, head_dim=128).bytes_per_token_per_head_layer
    512
    >>> ModelShape.mla(num_layers=61, latent_dim=576).num_kv_heads
    1
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    attention: Attention = "mha"
    dtype: str = "bfloat16"
    scale_format: str | None = None
    groups: tuple[LayerGroup, ...] = ()
    layers: tuple[int, ...] = ()
    index_head_dim: int | None = None
    """Group 0's sparse indexer cache (an MLA model's), values per token [INDEX-1]."""

    def __post_init__(self) -> None:
        require_int("num_layers", self.num_layers, minimum=1)
        require_int("num_kv_heads", self.num_kv_heads, minimum=1)
        require_int("head_dim", self.head_dim, minimum=1)
        require_choice("attention", self.attention, ATTENTION_KINDS)
        check_dtype(self.dtype)
        if self.attention == "mla" and self.num_kv_heads != 1:
            raise ValueError(
                f"an MLA cache has no head axis, so num_kv_heads must be 1 (the latent), "
                f"got num_kv_heads={self.num_kv_heads}; give the latent width as head_dim "
                f"or use ModelShape.mla(num_layers, latent_dim)"
            )
        if self.dtype in FP8_DTYPES:
            if self.scale_format is None:
                object.__setattr__(self, "scale_format", SCALE_FORMATS[0])
            require_choice("scale_format", self.scale_format, SCALE_FORMATS)
        elif self.scale_format is not None:
            raise ValueError(
                f"scale_format is only for fp8 dtypes ({', '.join(FP8_DTYPES)}); "
                f"dtype={self.dtype!r} must have scale_format=None, got {self.scale_format!r}"
            )
        check_indexer(self.index_head_dim, self.attention)
        self._check_groups()

    def _check_groups(self) -> None:
        """Refuse a layer map that does not give every layer one existing group, or a group
        no layer uses [GROUP-1]."""
        groups = tuple(group_from_dict(g) for g in self.groups)
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "layers", tuple(self.layers))
        if not groups and not self.layers:
            return
        if not groups:
            raise ValueError(
                "a layer map without groups: a model of one group needs neither; give the other "
                "groups or drop 'layers' [GROUP-1]"
            )
        if len(self.layers) != self.num_layers:
            raise ValueError(
                f"the layer map gives {len(self.layers)} layer(s) a group, but the model has "
                f"num_layers={self.num_layers}; give every layer exactly one group [GROUP-1]"
            )
        for index, group in enumerate(self.layers):
            require_int(f"layers[{index}]", group, minimum=0)
            if group > len(groups):
                raise ValueError(
                    f"layer {index} names group {group}, but the model has groups 0..{len(groups)} "
                    "(0 is its own attention) [GROUP-1]"
                )
        unused = sorted(set(range(len(groups) + 1)) - set(self.layers))
        if unused:
            raise ValueError(
                f"group(s) {unused} hold no layer; every group needs at least one layer [GROUP-1]"
            )

    @classmethod
    def mla(cls, num_layers: int, latent_dim: int, dtype: str = "bfloat16") -> ModelShape:
        """An MLA model: one latent of ``latent_dim`` per token and layer [MODEL-2]."""
        return cls(num_layers, 1, latent_dim, attention="mla", dtype=dtype)

    @property
    def latent_dim(self) -> int:
        """The MLA latent width (``head_dim``); refused for MHA/GQA models."""
        if self.attention != "mla":
            raise ValueError(f"latent_dim is defined only for MLA models, not {self.attention!r}")
        return self.head_dim

    @property
    def kv_tensors(self) -> int:
        """Tensors per layer: 2 (K and V) for MHA/GQA, 1 (the latent) for MLA [MODEL-2]."""
        return 1 if self.attention == "mla" else 2

    @property
    def itemsize(self) -> int:
        """Bytes per cache element."""
        return itemsize(self.dtype)

    @property
    def bytes_per_token_per_head_layer(self) -> int:
        """Cache bytes one token adds for one head in one layer, K and V together."""
        return self.kv_tensors * self.head_dim * self.itemsize

    @property
    def hybrid(self) -> bool:
        """Whether the model is planned group by group: it has layer groups besides its
        own attention [GROUP-1], or an indexer beside its own latent [INDEX-1], which the
        uniform plan does not carry."""
        return bool(self.groups) or self.index_head_dim is not None

    @property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """Every group, index 0 the model's own attention [GROUP-1]."""
        own = FullAttention(
            self.num_kv_heads, self.head_dim, self.attention, index_head_dim=self.index_head_dim
        )
        return (own, *self.groups)

    def group_of(self, layer: int) -> int:
        """The index of layer ``layer``'s group [GROUP-1]."""
        require_int("layer", layer, minimum=0)
        if layer >= self.num_layers:
            raise ValueError(f"layer {layer} is outside the model's {self.num_layers} layers")
        return self.layers[layer] if self.layers else 0

    def group_layers(self, group: int) -> tuple[int, ...]:
        """The layers of group ``group``, ascending [GROUP-1]."""
        if not self.layers:
            return tuple(range(self.num_layers)) if group == 0 else ()
        return tuple(i for i, g in enumerate(self.layers) if g == group)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, the constructor's keyword arguments; ``groups`` (each with its
        ``kind``) and ``layers`` only for a hybrid model, so a uniform model's form is
        today's [GROUP-1]."""
        data = asdict(self)
        del data["groups"], data["layers"]
        if self.index_head_dim is None:
            del data["index_head_dim"]
        if self.groups:
            data["groups"] = [g.to_dict() for g in self.groups]
            data["layers"] = list(self.layers)
        return data

    @classmethod
    def from_dict(cls, data: object, *, where: str = "ModelShape") -> ModelShape:
        """Inverse of :meth:`to_dict`; omitted fields take their defaults, an unknown key
        or any other value is refused with :class:`~kvspec.core.errors.FormError`."""
        return dataclass_form(
            cls,
            data,
            where=where,
            required=("num_layers", "num_kv_heads", "head_dim"),
            lists=("groups", "layers"),
        )

    def describe(self) -> str:
        """Short human form, e.g. ``32 layers, 8 KV heads x 128, mha, bfloat16``."""
        if self.attention == "mla":
            body = f"{self.num_layers} layers, MLA latent {self.head_dim}"
        else:
            body = f"{self.num_layers} layers, {self.num_kv_heads} KV heads x {self.head_dim}"
        extra = f", scales {self.scale_format}" if self.scale_format else ""
        if self.index_head_dim:
            extra += f", indexer {self.index_head_dim}"
        if self.groups:
            extra += f", {len(self.groups) + 1} layer groups"
        return f"{body}, {self.dtype}{extra}"


_AGREED_FACTS = (
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "attention",
    "dtype",
    "scale_format",
    "groups",
    "layers",
    "index_head_dim",
)


def model_mismatches(source: ModelShape, target: ModelShape) -> list[str]:
    """Every fact on which the two stages' models disagree, as readable lines [MODEL-3]."""
    return [
        f"{fact}: source {getattr(source, fact)!r} != target {getattr(target, fact)!r}"
        for fact in _AGREED_FACTS
        if getattr(source, fact) != getattr(target, fact)
    ]


def check_compatible(source: ModelShape, target: ModelShape) -> None:
    """Refuse a transfer between stages whose model facts differ, naming each one [MODEL-3]."""
    mismatches = model_mismatches(source, target)
    if mismatches:
        raise ValueError(
            f"the stages disagree on {len(mismatches)} model fact(s); refusing the transfer "
            "before any byte moves:\n  " + "\n  ".join(mismatches)
        )
