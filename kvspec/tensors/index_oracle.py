"""The coordinate-hash oracle for an MLA group's sparse indexer cache [INDEX-1, ORACLE-1].

An indexer value is known from its coordinates like KV: the oracle's start for (seed,
request) [ORACLE-1], then absorb of the layer, the part tag (``INDEX_TAG`` + the part's
index in :data:`~kvspec.topology.indexer.INDEX_PARTS`: values 0, scales 1), the global
token and the element's index in the token's entry; its value is that hash in the part's
dtype by ORACLE-2 (scales positive, as fp8 scales are [ORACLE-3]). The tag keeps every
indexer hash apart from the latent's (layer, token, latent index). So any rank fills the
tokens it holds and any receiver checks what it got bit for bit, with no ground truth
sent [ORACLE-4, ORACLE-5]. This is the simulated cluster's oracle, not a rule an engine
must follow.
"""

from __future__ import annotations

import torch

from kvspec.tensors.oracle import _start, _values, absorb
from kvspec.topology.indexer import INDEX_PARTS, index_widths
from kvspec.topology.tokens import Tokens

INDEX_TAG = 1 << 20
"""Added to the part index so an indexer hash never follows the latent's path."""


def oracle_index(
    index_head_dim: int,
    request_id: str,
    *,
    layers: tuple[int, ...],
    tokens: Tokens,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """The indexer entries of ``tokens`` in ``layers``: by part name, a tensor
    ``[len(layers), len(tokens), width]`` in the part's dtype [INDEX-1].

    >>> parts = oracle_index(128, "r", layers=(0, 2), tokens=Tokens.span(0, 3))
    >>> [(name, tuple(t.shape), str(t.dtype)) for name, t in parts.items()]
    [('index', (2, 3, 128), 'torch.float8_e4m3fn'), ('index_scale', (2, 3, 1), 'torch.float32')]
    """
    device = torch.device(device)
    widths = index_widths(index_head_dim)
    start = _start(seed, request_id)
    lay = torch.tensor(layers, dtype=torch.int64, device=device).view(-1, 1, 1)
    tok = torch.tensor(tokens.tokens(), dtype=torch.int64, device=device).view(1, -1, 1)
    out: dict[str, torch.Tensor] = {}
    for index, (name, dtype) in enumerate(INDEX_PARTS):
        element = torch.arange(widths[name], dtype=torch.int64, device=device).view(1, 1, -1)
        h = absorb(torch.full((1, 1, 1), start, dtype=torch.int64, device=device), lay)
        h = absorb(absorb(absorb(h, INDEX_TAG + index), tok), element)
        shape = (len(layers), len(tokens), widths[name])
        out[name] = _values(h.expand(shape).contiguous(), dtype, positive=name == "index_scale")
    return out
