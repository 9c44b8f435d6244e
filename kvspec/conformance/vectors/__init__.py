"""Golden vectors: the spec's cases and expected outputs as language-neutral files.

``kvspec vectors export DIR`` writes ``DIR/manifest.json`` (cases and expected
results, plain JSON) and ``DIR/tensors.safetensors`` (every tensor a case names,
by key), the same bytes on every run. ``docs/vectors.md`` documents the schema so a
C++ or Rust implementation can conform without Python; ``kvspec vectors check DIR
--impl IMPL`` replays the vectors through an adapter.

Each family of vectors is a :class:`Family`: a deterministic ``export`` (cases,
tensors) and a ``check`` that replays one case through an adapter. A family is one
module, named after it, holding both side by side and the clause ids it covers
(``ownership``, ``tokens``, ``plan``, ``errors``, ``reshard``, ``layouts``, ``paged``,
``records``, ``descriptors``, ``oracle``, ``keys``, ``ports``, ``wire``, ``groups``,
``states``, ``state_layouts``, ``cross_layer``, ``scaled``);
:mod:`~kvspec.conformance.vectors.family` says what a family is,
:mod:`~kvspec.conformance.vectors.sampling` holds the configurations the families
share, and :mod:`~kvspec.conformance.vectors.format` the files, their loader and the
replay.
"""

from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.conformance.vectors.format import (
    FAMILIES,
    FAMILY_NAMES,
    FORMAT,
    GOLDEN_DIR,
    MANIFEST_FILE,
    TENSORS_FILE,
    VERSION,
    VectorResult,
    VectorsError,
    check_vectors,
    export_vectors,
    load_vectors,
)
from kvspec.conformance.vectors.sampling import PARALLEL, PINNED

__all__ = [
    "FAMILIES",
    "FAMILY_NAMES",
    "FORMAT",
    "GOLDEN_DIR",
    "MANIFEST_FILE",
    "PARALLEL",
    "PINNED",
    "TENSORS_FILE",
    "VERSION",
    "Case",
    "Family",
    "NotApplicable",
    "Tensors",
    "VectorResult",
    "VectorsError",
    "check_vectors",
    "export_vectors",
    "load_vectors",
]
