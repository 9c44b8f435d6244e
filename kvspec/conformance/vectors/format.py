"""The vector set on disk and its replay: ``export_vectors`` writes
``DIR/manifest.json`` (every family's cases, plain JSON, keys sorted) and
``DIR/tensors.safetensors`` (every tensor a case names, by key), the same bytes on
every run; ``load_vectors`` reads a set back, refusing a malformed one with
:class:`VectorsError`; ``check_vectors`` replays it through an adapter, family by family.

Each family draws from its own generator, seeded ``f"{seed}:{family.name}"``, so a
family's cases do not depend on the others'.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from safetensors.torch import load_file, save_file

from kvspec import __version__
from kvspec.conformance.adapter import Adapter, FullAdapter, provided_capabilities
from kvspec.conformance.families.descriptors import vectors as descriptors
from kvspec.conformance.families.groups import state_layout_vectors as state_layouts
from kvspec.conformance.families.groups import state_vectors as states
from kvspec.conformance.families.groups import vectors as groups
from kvspec.conformance.families.layouts import cross_layer_vectors as cross_layer
from kvspec.conformance.families.layouts import record_vectors as records
from kvspec.conformance.families.layouts import scaled_vectors as scaled
from kvspec.conformance.families.layouts import vectors as layouts
from kvspec.conformance.families.naming import key_vectors as keys
from kvspec.conformance.families.naming import port_vectors as ports
from kvspec.conformance.families.oracle import vectors as oracle
from kvspec.conformance.families.ownership import token_vectors as tokens
from kvspec.conformance.families.ownership import vectors as ownership
from kvspec.conformance.families.paged import vectors as paged
from kvspec.conformance.families.routing import vectors as plan
from kvspec.conformance.families.transfer import vectors as reshard
from kvspec.conformance.families.wire import vectors as wire
from kvspec.conformance.vectors import errors
from kvspec.conformance.vectors.family import Case, Family, NotApplicable, Tensors
from kvspec.core.errors import InputError

FORMAT = "kvspec-golden-vectors"
VERSION = 1
TENSORS_FILE = "tensors.safetensors"
MANIFEST_FILE = "manifest.json"
GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
"""The golden vectors shipped inside the package: ``kvspec vectors check``'s default."""

FAMILIES: tuple[Family, ...] = (
    ownership.FAMILY,
    tokens.FAMILY,
    plan.FAMILY,
    errors.FAMILY,
    reshard.FAMILY,
    layouts.FAMILY,
    paged.FAMILY,
    records.FAMILY,
    descriptors.FAMILY,
    oracle.FAMILY,
    keys.FAMILY,
    ports.FAMILY,
    wire.FAMILY,
    groups.FAMILY,
    states.FAMILY,
    state_layouts.FAMILY,
    cross_layer.FAMILY,
    scaled.FAMILY,
)
"""Every family, in the order they are exported and replayed."""


def export_vectors(directory: str | Path, *, seed: int = 0) -> Path:
    """Write the manifest and the tensors into ``directory``; the same bytes every run."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    families: dict[str, list[Case]] = {}
    tensors: Tensors = {}
    for family in FAMILIES:
        cases, family_tensors = family.export(random.Random(f"{seed}:{family.name}"))
        families[family.name] = cases
        tensors.update(family_tensors)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "kvspec_version": __version__,
        "seed": seed,
        "tensors_file": TENSORS_FILE,
        "families": families,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    save_file(
        {k: v.detach().cpu().clone() for k, v in tensors.items()},
        out / TENSORS_FILE,
        metadata={"format": f"{FORMAT}/{VERSION}"},
    )
    return out


@dataclass
class VectorResult:
    family: str
    case_id: str
    verdict: str  # "passed", "FAILED", "not applicable"
    detail: str = ""


class VectorsError(InputError):
    """A directory that is not a readable vector set; the message names the file and why."""


def load_vectors(directory: str | Path) -> tuple[dict[str, Any], Tensors]:
    """The manifest and tensors of a vector set, refusing anything malformed with
    :class:`VectorsError` (never a ``KeyError`` or a library's own exception)."""
    root = Path(directory)
    path = root / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise VectorsError(f"{path}: cannot read a JSON manifest: {_short(error)}") from None
    if not isinstance(manifest, dict):
        raise VectorsError(f"{path}: the manifest must be a JSON object")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise VectorsError(
            f"{path} is not {FORMAT} version {VERSION}: "
            f"format={_short(manifest.get('format'))}, version={_short(manifest.get('version'))}"
        )
    families, tensors_file = manifest.get("families"), manifest.get("tensors_file")
    if not isinstance(families, dict) or not all(
        isinstance(cases, list)
        and all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cases)
        for cases in families.values()
    ):
        raise VectorsError(f"{path}: 'families' must map a family name to a list of cases with ids")
    if not isinstance(tensors_file, str) or Path(tensors_file).name != tensors_file:
        raise VectorsError(f"{path}: 'tensors_file' must name a file beside the manifest")
    try:
        tensors = load_file(root / tensors_file)
    except Exception as error:  # safetensors raises its own types for damaged files
        raise VectorsError(f"{root / tensors_file}: cannot read tensors: {_short(error)}") from None
    return manifest, tensors


def _short(value: object, limit: int = 120) -> str:
    """``repr(value)``, cut to ``limit`` characters, so a huge bad value stays readable."""
    text = repr(value) if not isinstance(value, BaseException) else f"{value}"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
"""The vector families, in the order they are replayed."""


def check_vectors(
    directory: str | Path, adapter: Adapter, families: Collection[str] | None = None
) -> list[VectorResult]:
    """Replay every vector (or those of ``families``) through ``adapter``; families it
    lacks are not applicable. An unknown family name is a ValueError naming the known
    ones, raised before anything is read."""
    unknown = sorted(set(families or ()) - set(FAMILY_NAMES))
    if unknown:
        raise ValueError(
            f"no vector family {', '.join(map(repr, unknown))}; the families are "
            f"{', '.join(FAMILY_NAMES)}"
        )
    manifest, tensors = load_vectors(directory)
    provided = provided_capabilities(adapter)
    results = []
    for family in FAMILIES:
        if families is not None and family.name not in families:
            continue
        for case in manifest["families"].get(family.name, []):
            if not set(family.needs) <= provided:
                results.append(
                    VectorResult(
                        family.name,
                        case["id"],
                        "not applicable",
                        f"needs {', '.join(family.needs)}",
                    )
                )
                continue
            try:
                problem = family.check(cast(FullAdapter, adapter), case, tensors)  # has needs
            except NotApplicable as why:
                results.append(VectorResult(family.name, case["id"], "not applicable", str(why)))
                continue
            except Exception as error:
                problem = f"raised {error!r}"
            verdict = "passed" if problem is None else "FAILED"
            results.append(VectorResult(family.name, case["id"], verdict, problem or ""))
    return results
