"""Golden vectors: byte-identical export, the shipped copy up to date, replayable through
adapters, and a malformed vector set refused with a message instead of a traceback."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from kvspec.cli import main
from kvspec.conformance import Adapter, load_adapter
from kvspec.conformance.adapter.protocols import RoutingProtocol
from kvspec.conformance.domain import Domain
from kvspec.conformance.families.groups.block_size_mutants import (
    OneBlockSizeForBoth,
    StatePageAtTp1,
    WindowAlignedToSenderBlocks,
)
from kvspec.conformance.families.groups.mutants import (
    EmptyChunkNotSpecialCased,
    ReplicatedPartOffsetScaledByTpRatio,
    WindowStartNotBlockAligned,
)
from kvspec.conformance.families.groups.state_layout_mutants import ConvAlwaysStateLenFirst
from kvspec.conformance.families.routing.mutants import ReplicasMergedTwice
from kvspec.conformance.families.transfer.mutants import OffByOneHeadOffset
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.vectors import (
    GOLDEN_DIR,
    MANIFEST_FILE,
    VectorsError,
    check_vectors,
    export_vectors,
    load_vectors,
)
from kvspec.topology.model_presets import PRESETS as MODEL_PRESETS
from kvspec.topology.model_presets import model_preset


def test_export_is_byte_identical_and_matches_the_shipped_vectors(tmp_path: Path) -> None:
    a, b = export_vectors(tmp_path / "a"), export_vectors(tmp_path / "b")
    for name in ("manifest.json", "tensors.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / name).read_bytes() == (GOLDEN_DIR / name).read_bytes(), "run: make vectors"


FIRST_RELEASE_VECTORS = {
    # family: (cases the first release shipped, sha256 prefix of their canonical JSON)
    "ownership": (72, "e53f9ea0240ee9be"),
    "plan": (46, "f258750ea99526aa"),
    "reshard": (15, "8ad72709ec351f83"),
    "oracle": (10, "a88a41b7ee469d4e"),
    "keys": (20, "5efe11188466dbbc"),
    "ports": (24, "66dfa1fe129d626e"),
    "wire": (6, "ff815a72434335f4"),
}
"""Digests of the vectors shipped before attention groups and token shards existed."""


def test_the_first_release_vectors_are_unchanged() -> None:
    """Defaults (cp = dcp = dp = 1, dividing TP) reproduce the first release's vectors
    exactly: the new axes only append cases, and append tensors under new keys."""
    manifest, tensors = load_vectors(GOLDEN_DIR)
    for family, (count, digest) in FIRST_RELEASE_VECTORS.items():
        cases = manifest["families"][family]
        assert len(cases) > count or family in ("keys", "wire"), family
        text = json.dumps(cases[:count], sort_keys=True)
        assert hashlib.sha256(text.encode()).hexdigest()[:16] == digest, family
    first = {c["id"] for c in manifest["families"]["reshard"][:15]}
    names = sorted(k for k in tensors if k.split("/")[0] in first)
    content = hashlib.sha256()
    for name in names:
        content.update(name.encode())
        content.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    assert (len(names), content.hexdigest()[:16]) == (701, "08359fbd187b11e2")


def test_the_vectors_cover_the_new_axes() -> None:
    manifest, _ = load_vectors(GOLDEN_DIR)
    families = manifest["families"]
    plans = families["plan"]
    assert any("heads_in_shard" in e for p in plans for e in p["edges"])  # TP4 <-> TP6
    assert any("tokens" in e for p in plans for e in p["edges"])  # token shards
    assert any(p["source"].get("dp", 1) > 1 and p.get("source_dp") for p in plans)
    assert {r.split(":")[0] for c in families["tokens"] for r in [c["layout"]["cp_rule"]]} == {
        "contiguous",
        "interleave",
        "round_robin_blocks",
        "zigzag",
    }
    assert any(c["layout"].get("dcp", 1) > 1 for c in families["tokens"])
    assert any(c["targets"].count(None) for c in [r["tensors"] for r in families["reshard"]])
    assert any("layout" in c and c["dp_stride"] for c in families["ports"])
    assert any(isinstance(c["region"]["tokens"][0], list) for c in families["oracle"])


def test_the_reference_passes_every_vector() -> None:
    results = check_vectors(GOLDEN_DIR, load_adapter("reference"))
    assert {r.verdict for r in results if r.family != "errors"} == {"passed"}
    assert [r for r in results if r.verdict == "FAILED"] == []


class PipelineFreeMha(ReferenceAdapter):
    """An implementation of one-stage-deep MHA only, which says so in its domain."""

    domain = Domain(pp_sizes=(1,), attention=("mha",), replicated_heads=False)

    def owned(self, layout, model, rank):
        assert layout.pp == 1 and model.attention == "mha", "asked outside its domain"
        assert model.num_kv_heads >= layout.tp, "asked outside its domain"
        return super().owned(layout, model, rank)


def test_a_vector_outside_the_adapters_domain_is_not_applicable() -> None:
    """Ownership vectors with PP > 1, MLA or replicated heads are not asked of an adapter
    whose domain leaves them out: the same stages the suite would not draw for it."""
    results = check_vectors(GOLDEN_DIR, PipelineFreeMha(), families=("ownership",))
    verdicts = {r.verdict for r in results}
    assert verdicts == {"passed", "not applicable"}, [r for r in results if r.verdict == "FAILED"]
    outside = [r for r in results if r.verdict == "not applicable"]
    assert all("outside the adapter's declared domain" in r.detail for r in outside)


def test_an_adapter_naming_no_policy_has_its_plans_checked_as_lowest() -> None:
    """Without Adapter.policies the suite draws its routing cases with 'lowest'; the plan
    vectors do the same instead of leaving every plan not applicable."""

    class RoutingOnly(Adapter, RoutingProtocol):
        domain = load_adapter("reference").domain

        def sources(self, case, dst):
            return sorted({e.src for e in case.plan().edges if e.dst == dst})

        def targets(self, case, src):
            return sorted({e.dst for e in case.plan().edges if e.src == src})

    results = check_vectors(GOLDEN_DIR, RoutingOnly(), families=("plan",))
    passed = [r for r in results if r.verdict == "passed"]
    skipped = {r.detail for r in results if r.verdict == "not applicable"}
    assert passed and not [r for r in results if r.verdict == "FAILED"]
    assert skipped <= {"policy 'balanced' not implemented by the adapter"}


def test_mutants_fail_the_vectors() -> None:
    for mutant, family in ((OffByOneHeadOffset, "reshard"), (ReplicasMergedTwice, "plan")):
        failed = {r.family for r in check_vectors(GOLDEN_DIR, mutant()) if r.verdict == "FAILED"}
        assert family in failed, mutant.__name__


def test_hybrid_vectors_cover_every_preset_and_catch_hybrid_mutants() -> None:
    manifest = json.loads((GOLDEN_DIR / "manifest.json").read_text())
    families = manifest["families"]
    planned = [c["model"] for c in families["groups"]]
    assert all(model_preset(name).to_dict() in planned for name in MODEL_PRESETS)
    # some windows are cut (they start past token 0 at a block boundary), some are whole
    cut = [c for c in families["groups"] for w in c["windows"] if w["tokens"][:1] > [[0, 0]]]
    assert cut and all(
        w["tokens"][0][0] % c["block_size"] == 0 for c in cut for w in c["windows"] if w["tokens"]
    )
    assert any(w["tokens"] == [[0, c["seq_len"]]] for c in families["groups"] for w in c["windows"])
    assert {c["layout"] for c in families["state-layouts"]} == {"vllm_conv_sd", "vllm_conv_ds"}
    # chunked groups: some inside a chunk, some on a boundary that is not a block boundary
    chunked = [(c, k) for c in families["groups"] for k in c.get("chunks", ())]
    assert any(k["tokens"] for _, k in chunked)
    assert any(
        c["seq_len"] % k["chunk"] == 0 and c["seq_len"] % c["block_size"] and not k["tokens"]
        for c, k in chunked
    )
    # two block sizes per plan: some planned, some refused for evicted tokens [WINDOW-2]
    two = [
        c
        for c in families["groups"]
        if c.get("source_block_size", c["block_size"]) != c["block_size"]
    ]
    assert any("refused" in c for c in two) and any("edges" in c for c in two)
    assert any(c.get("derived_block_sizes") == {"1": 144, "4": 80} for c in two)
    for mutant, family in (
        (WindowAlignedToSenderBlocks, "groups"),
        (OneBlockSizeForBoth, "groups"),
        (StatePageAtTp1, "groups"),
        (WindowStartNotBlockAligned, "groups"),
        (EmptyChunkNotSpecialCased, "groups"),
        (ReplicatedPartOffsetScaledByTpRatio, "states"),
        (ConvAlwaysStateLenFirst, "state-layouts"),
    ):
        results = check_vectors(GOLDEN_DIR, mutant(), [family])
        assert {r.family for r in results} == {family}
        assert any(r.verdict == "FAILED" for r in results), mutant.__name__


def test_a_family_filter_replays_those_families_alone_and_refuses_unknown_names(capsys) -> None:
    results = check_vectors(GOLDEN_DIR, load_adapter("reference"), ["keys", "ports"])
    manifest = json.loads((GOLDEN_DIR / "manifest.json").read_text())["families"]
    assert [r.family for r in results] == ["keys"] * len(manifest["keys"]) + ["ports"] * len(
        manifest["ports"]
    )
    with pytest.raises(ValueError, match=r"no vector family 'key'; the families are .*keys"):
        check_vectors(GOLDEN_DIR, load_adapter("reference"), ["key"])
    mutant = "kvspec.conformance.families.transfer.mutants:OffByOneHeadOffset"
    assert main(["vectors", "check", "--impl", mutant, "--family", "keys"]) == 0
    assert "\nkeys " in capsys.readouterr().out
    assert main(["vectors", "check", "--impl", mutant, "--family", "reshard"]) == 1
    out = capsys.readouterr().out
    assert "\nreshard " in out and "\nkeys " not in out
    with pytest.raises(SystemExit) as refused:
        main(["vectors", "check", "--impl", "reference", "--family", "key"])
    assert refused.value.code == 2
    assert "invalid choice: 'key'" in capsys.readouterr().err


def test_cli_checks_the_installed_vectors_by_default(tmp_path: Path, capsys) -> None:
    assert main(["vectors", "check", "--impl", "reference"]) == 0
    assert (
        main(
            [
                "vectors",
                "check",
                "--impl",
                "kvspec.conformance.families.transfer.mutants:OffByOneHeadOffset",
            ]
        )
        == 1
    )
    assert main(["vectors", "check", str(tmp_path), "--impl", "reference"]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_cli_json_to_stdout(capsys) -> None:
    assert main(["vectors", "check", "--impl", "reference", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {"family", "case_id", "verdict", "detail"} <= set(rows[0])


def test_each_action_has_its_own_help(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["vectors", "check", "--help"])
    text = capsys.readouterr().out
    assert "--impl" in text and "--seed" not in text


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "v"
    out.mkdir()
    for name in ("manifest.json", "tensors.safetensors"):
        (out / name).write_bytes((GOLDEN_DIR / name).read_bytes())
    return out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: "[1, 2]", "must be a JSON object"),
        (lambda m: "{not json", "cannot read a JSON manifest"),
        (lambda m: json.dumps({**m, "version": 99}), "is not kvspec-golden-vectors version"),
        (lambda m: json.dumps({**m, "families": []}), "'families' must map"),
        (lambda m: json.dumps({**m, "families": {"plan": [{"no": "id"}]}}), "'families' must map"),
        (lambda m: json.dumps({**m, "tensors_file": "../x"}), "'tensors_file' must name"),
        (lambda m: json.dumps({**m, "tensors_file": 7}), "'tensors_file' must name"),
        (lambda m: "[" * 100_000, "cannot read a JSON manifest"),
    ],
)
def test_malformed_manifests_are_refused(tmp_path: Path, damage, message) -> None:
    root = _copy(tmp_path)
    manifest = json.loads((root / MANIFEST_FILE).read_text())
    (root / MANIFEST_FILE).write_text(damage(manifest))
    with pytest.raises(VectorsError, match=message):
        load_vectors(root)


def test_a_damaged_tensor_file_is_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "tensors.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(VectorsError, match="cannot read tensors"):
        load_vectors(root)
