"""Layer groups: the kinds of cache a layer can keep, each with its own facts [GROUP-1, GROUP-2].

A hybrid model is a list of layer groups and a map from each layer to its group
[GROUP-1]. Two families of kinds exist:

- **per-token KV** (:class:`FullAttention`, :class:`SlidingWindow`,
  :class:`ChunkedLocal`, :class:`DraftAttention`): heads x head_dim per token, split over
  TP by HEAD-1..3 like today's uniform models; a sliding window keeps only its last
  ``window`` tokens [WINDOW-1], a chunked local-attention layer only its current chunk
  [LOCAL-1].
- **per-request state** (:class:`Mamba1State`, :class:`Mamba2State`, :class:`GdnState`):
  a fixed-size state per request, made of :class:`StatePart` s, each split over TP by its
  own unit (heads, groups, channels) [STATE-1].

The state shapes restate vLLM 0.33.0 ``MambaStateShapeCalculator``
(``vllm/model_executor/layers/mamba/mamba_utils.py``; field/research/hybrids.md §2):
Mamba-1 conv ``(intermediate, K-1)`` and temporal ``(intermediate, d_state)``; Mamba-2
conv ``x|B|C`` of ``num_heads*head_dim + 2*n_groups*d_state`` channels and temporal
``(num_heads, head_dim, d_state)``; GDN conv ``Q|K|V`` of
``2*num_k_heads*head_k_dim + num_v_heads*head_v_dim`` channels and temporal
``(num_v_heads, head_v_dim, head_k_dim)``. Conv rows are ``K - 1 + num_spec``
(speculative decoding enlarges them, ``qwen3_next.py``; hybrids.md §2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kvspec.core.clause import Clause, must, refuses
from kvspec.core.dtype_names import check_dtype
from kvspec.core.errors import FormError
from kvspec.core.forms import dataclass_form
from kvspec.core.require import require_choice, require_int, show
from kvspec.topology.indexer import check_indexer

CLAUSES = (
    Clause(
        "GROUP-1",
        "A model is layer groups",
        "A model shape's layers each belong to one layer group. Group 0 is the model's own "
        "attention (num_kv_heads, head_dim, attention [MODEL-1]); 'groups' lists the others and "
        "'layers' gives, for every layer index 0..num_layers-1, the index of its group. A model "
        "without groups is one full-attention group holding every layer: exactly today's "
        "uniform model, with the same plain-data form. A layer map of another length than "
        "num_layers, naming a group that does not exist, or a group no layer uses is refused; "
        "so is a group map without groups.",
        obligations=(
            must(
                "a model without groups is one full-attention group of every layer, with the "
                "uniform model's plain-data form"
            ),
            refuses("a layer map of another length than num_layers"),
            refuses("a layer map naming a group that does not exist"),
            refuses("a group that no layer belongs to"),
            must("each layer is planned with the facts of its own group"),
        ),
    ),
    Clause(
        "GROUP-2",
        "Each group kind has its own facts",
        "Per-token kinds: 'full' (num_kv_heads, head_dim, attention 'mha' or 'mla'), "
        "'sliding' (the same and window >= 1 tokens), 'chunked' (the same and chunk >= 1 "
        "tokens [LOCAL-1]) and 'draft' (a draft/MTP layer with its "
        "own num_kv_heads and head_dim, never the target's [vllm-ascend#11886]). Per-request "
        "state kinds: 'mamba1' (intermediate_size, d_state, conv_kernel), 'mamba2' (num_heads, "
        "head_dim, n_groups dividing num_heads, d_state, conv_kernel, num_spec) and 'gdn' "
        "(num_k_heads, num_v_heads a multiple of num_k_heads, head_k_dim, head_v_dim, "
        "conv_kernel, num_spec); 'none' is a layer with no cache (an MLP-only layer of a hybrid "
        "pattern), which moves nothing. A state's temporal part may have its own ssm_dtype "
        "(vLLM mamba_ssm_cache_dtype); its conv parts have the model's dtype. Sizes are "
        "integers >= 1 "
        "(conv_kernel >= 2, num_spec >= 0); anything else is refused with the value.",
        obligations=(
            refuses("a group size below its minimum, or not an integer"),
            refuses("a Mamba-2 group count that does not divide its heads"),
            refuses("an unknown group kind"),
            must("a draft group's bytes use its own head count and head_dim, not the target's"),
        ),
    ),
)


@dataclass(frozen=True)
class StatePart:
    """One part of a per-request state, as its TP sharding sees it [STATE-1].

    ``units`` things (heads, groups or channels) are split over TP like KV heads
    [HEAD-1, HEAD-2]; each unit is ``width`` x ``rows`` contiguous elements in the
    dim-first (DS) order vLLM's heterogeneous-TP transfer requires (hybrids.md §2-3).
    """

    name: str
    units: int
    width: int
    rows: int

    @property
    def unit_elements(self) -> int:
        """Elements of one unit: ``width * rows``."""
        return self.width * self.rows


class _Group:
    """Shared plain-data behaviour of the group kinds."""

    kind: ClassVar[str]
    per_token: ClassVar[bool]
    if TYPE_CHECKING:  # every kind is a dataclass, so asdict() and fields() take self
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form: ``kind`` and the constructor's keyword arguments."""
        return {"kind": self.kind, **asdict(self)}

    def describe(self) -> str:
        facts = ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"{self.kind}({facts})"


@dataclass(frozen=True)
class FullAttention(_Group):
    """Full attention: MHA/GQA/MQA heads, or an MLA latent as one head [MODEL-2]."""

    kind: ClassVar[str] = "full"
    per_token: ClassVar[Literal[True]] = True  # a Literal, so `if group.per_token` narrows
    num_kv_heads: int
    head_dim: int
    attention: str = "mha"
    index_head_dim: int | None = field(default=None, kw_only=True)
    """An MLA group's sparse indexer cache, values per token (None: none) [INDEX-1]."""

    def __post_init__(self) -> None:
        require_int("num_kv_heads", self.num_kv_heads, minimum=1)
        require_int("head_dim", self.head_dim, minimum=1)
        require_choice("attention", self.attention, ("mha", "mla"))
        if self.attention == "mla" and self.num_kv_heads != 1:
            raise ValueError(
                f"an MLA group has no head axis, so num_kv_heads must be 1, got "
                f"{self.num_kv_heads} [MODEL-2]"
            )
        check_indexer(self.index_head_dim, self.attention)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form; ``index_head_dim`` only when the group has an indexer, so a
        group without one keeps its form [INDEX-1]."""
        data = super().to_dict()
        if data["index_head_dim"] is None:
            del data["index_head_dim"]
        return data

    def describe(self) -> str:
        text = super().describe()
        return text.replace(", index_head_dim=None", "")

    @property
    def kv_tensors(self) -> int:
        """2 (K and V), or 1 for the MLA latent [MODEL-2]."""
        return 1 if self.attention == "mla" else 2


@dataclass(frozen=True)
class SlidingWindow(FullAttention):
    """Sliding-window attention: a receiver needs only the last ``window`` tokens [WINDOW-1]."""

    kind: ClassVar[str] = "sliding"
    window: int = field(kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("window", self.window, minimum=1)


@dataclass(frozen=True)
class ChunkedLocal(FullAttention):
    """Chunked local attention: a token attends only within its chunk of ``chunk`` tokens,
    so a receiver needs only the current, unfinished chunk [LOCAL-1] (Llama 4's
    ``attention_chunk_size`` layers; vLLM ``ChunkedLocalAttentionSpec``)."""

    kind: ClassVar[str] = "chunked"
    chunk: int = field(kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("chunk", self.chunk, minimum=1)


@dataclass(frozen=True)
class DraftAttention(FullAttention):
    """A draft/MTP layer: attention with its own head count [GROUP-2]; vLLM builds it at
    layer index ``num_hidden_layers`` (``qwen3_next_mtp.py``, ``deepseek_mtp.py``;
    hybrids.md §1a, §1f)."""

    kind: ClassVar[str] = "draft"


@dataclass(frozen=True)
class _State(_Group):
    per_token: ClassVar[Literal[False]] = False

    def parts(self) -> tuple[StatePart, ...]:
        raise NotImplementedError


@dataclass(frozen=True)
class Mamba1State(_State):
    """Mamba-1: conv ``(intermediate, K-1)`` and temporal ``(intermediate, d_state)``, both
    sharded by channel (vLLM 0.33.0 ``mamba1_state_shape``; hybrids.md §2)."""

    kind: ClassVar[str] = "mamba1"
    intermediate_size: int
    d_state: int
    conv_kernel: int
    ssm_dtype: str | None = None

    def __post_init__(self) -> None:
        require_int("intermediate_size", self.intermediate_size, minimum=1)
        require_int("d_state", self.d_state, minimum=1)
        require_int("conv_kernel", self.conv_kernel, minimum=2)
        if self.ssm_dtype is not None:
            check_dtype(self.ssm_dtype)

    def parts(self) -> tuple[StatePart, ...]:
        return (
            StatePart("conv", self.intermediate_size, 1, self.conv_kernel - 1),
            StatePart("ssm", self.intermediate_size, self.d_state, 1),
        )


@dataclass(frozen=True)
class Mamba2State(_State):
    """Mamba-2: conv ``x|B|C`` (x by heads, B and C by groups) and temporal
    ``(num_heads, head_dim, d_state)`` by heads (vLLM 0.33.0 ``mamba2_state_shape``,
    ``mamba_mixer2.py``; hybrids.md §2)."""

    kind: ClassVar[str] = "mamba2"
    num_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    conv_kernel: int
    num_spec: int = 0
    ssm_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "n_groups", "d_state"):
            require_int(name, getattr(self, name), minimum=1)
        require_int("conv_kernel", self.conv_kernel, minimum=2)
        require_int("num_spec", self.num_spec, minimum=0)
        if self.num_heads % self.n_groups:
            raise ValueError(
                f"a Mamba-2 state's n_groups must divide num_heads (each group serves whole "
                f"heads), got {self.num_heads} heads in {self.n_groups} groups [GROUP-2]"
            )
        if self.ssm_dtype is not None:
            check_dtype(self.ssm_dtype)

    def parts(self) -> tuple[StatePart, ...]:
        rows = self.conv_kernel - 1 + self.num_spec
        return (
            StatePart("x", self.num_heads, self.head_dim, rows),
            StatePart("B", self.n_groups, self.d_state, rows),
            StatePart("C", self.n_groups, self.d_state, rows),
            StatePart("ssm", self.num_heads, self.head_dim * self.d_state, 1),
        )


@dataclass(frozen=True)
class GdnState(_State):
    """Gated DeltaNet (linear attention): conv ``Q|K|V`` (Q and K by k-heads, V by v-heads)
    and temporal ``(num_v_heads, head_v_dim, head_k_dim)`` by v-heads (vLLM 0.33.0
    ``gated_delta_net_state_shape``; hybrids.md §2)."""

    kind: ClassVar[str] = "gdn"
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    num_spec: int = 0
    ssm_dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"):
            require_int(name, getattr(self, name), minimum=1)
        require_int("conv_kernel", self.conv_kernel, minimum=2)
        require_int("num_spec", self.num_spec, minimum=0)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"a GDN state's num_v_heads must be a multiple of num_k_heads, got "
                f"{self.num_v_heads} and {self.num_k_heads} [GROUP-2]"
            )
        if self.ssm_dtype is not None:
            check_dtype(self.ssm_dtype)

    def parts(self) -> tuple[StatePart, ...]:
        rows = self.conv_kernel - 1 + self.num_spec
        return (
            StatePart("Q", self.num_k_heads, self.head_k_dim, rows),
            StatePart("K", self.num_k_heads, self.head_k_dim, rows),
            StatePart("V", self.num_v_heads, self.head_v_dim, rows),
            StatePart("ssm", self.num_v_heads, self.head_v_dim * self.head_k_dim, 1),
        )


@dataclass(frozen=True)
class NoCache(_State):
    """A layer that keeps no cache (an MLP-only layer of a hybrid pattern): nothing moves."""

    kind: ClassVar[str] = "none"
    ssm_dtype: str | None = None

    def parts(self) -> tuple[StatePart, ...]:
        return ()


LayerGroup = FullAttention | Mamba1State | Mamba2State | GdnState | NoCache
"""Any group kind (SlidingWindow, ChunkedLocal and DraftAttention are FullAttention kinds)."""

StateGroup = Mamba1State | Mamba2State | GdnState | NoCache

KINDS: dict[str, type] = {
    cls.kind: cls
    for cls in (
        FullAttention,
        SlidingWindow,
        ChunkedLocal,
        DraftAttention,
        Mamba1State,
        Mamba2State,
        GdnState,
        NoCache,
    )
}
"""Group kind name -> its class [GROUP-2]."""


def group_from_dict(data: dict[str, Any] | LayerGroup) -> LayerGroup:
    """A group from its plain-data form (``kind`` and its facts); a group passes through."""
    if isinstance(data, FullAttention | _State):
        return data
    if not isinstance(data, Mapping):
        raise FormError(f"a layer group is a dict with a 'kind', got {show(data)} [GROUP-2]")
    facts = dict(data)
    kind = facts.pop("kind", None)
    if not isinstance(kind, str) or kind not in KINDS:
        raise FormError(
            f"unknown layer group kind {show(kind)}; known kinds: {', '.join(KINDS)} [GROUP-2]"
        )
    return dataclass_form(KINDS[kind], facts, where=f"layer group {kind!r}")
