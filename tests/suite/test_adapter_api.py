"""docs/adapter-api.md is rendered from the code, and the `config` schema it shows is the
one the suite really hands out."""

import dataclasses
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.conformance import transfer_config
from kvspec.conformance.adapter import CAPABILITIES, VALIDATORS
from kvspec.conformance.api_doc import COMMAND, render
from kvspec.conformance.checks import all_checks
from kvspec.conformance.families import error_cases
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.conformance.runner import FAILED, PASSED, get_check, run_check
from kvspec.conformance.transfer_config import (
    MODEL_KEYS,
    RANK_KEYS,
    STAGE_KEYS,
    TRANSFER_KEYS,
    RankConfig,
    StageConfig,
    TransferConfig,
    undocumented,
)
from kvspec.tensors.reshard import Shipment
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from tests.paths import ROOT

ERROR_CASES = error_cases()

PAGE = ROOT / "docs" / "adapter-api.md"


def test_the_committed_page_is_the_one_the_code_renders() -> None:
    assert PAGE.read_text() == render(), (
        f"docs/adapter-api.md is not what the code renders; regenerate it: {COMMAND}"
    )


def test_kvspec_adapter_doc_prints_and_writes_the_page(tmp_path: Path, capsys) -> None:
    assert main(["adapter", "doc"]) == 0
    assert capsys.readouterr().out == render()
    out = tmp_path / "api.md"
    assert main(["adapter", "doc", "--output", str(out)]) == 0
    assert out.read_text() == render()
    assert main(["adapter", "doc", "--output", str(tmp_path / "no" / "api.md")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _section(page: str, capability: str) -> str:
    start = page.index(f'<a id="cap-{capability}"></a>')
    end = page.find('<a id="cap-', start + 1)
    return page[start : end if end > 0 else None]


def test_every_capability_has_its_methods_arguments_and_checks() -> None:
    page = render()
    for capability, methods in CAPABILITIES.items():
        section = _section(page, capability)
        for method in methods:
            assert f"#### `{method}(" in section, (capability, method)
        needing = [c.id for c in all_checks() if capability in c.needs]
        for check_id in needing:
            assert f"`{check_id}`" in section, (capability, check_id)
    owned = _section(page, "ownership")
    assert "`owned(layout: StageLayout, model: ModelShape, rank: int) -> tuple[range, range]`" in (
        owned
    )
    assert "| `layout` | [`StageLayout`](#type-stagelayout) | always |" in owned


def test_the_page_says_routing_must_refuse_an_unknown_policy() -> None:
    routing = _section(render(), "routing")
    assert "**Must refuse**" in routing
    assert "`PLAN-4.4` a policy name that is not one of the implementation's policies" in routing
    assert "Refuse (raise) a `case.policy` the implementation does not implement" in routing


def test_the_page_names_the_one_refusal_held_to_an_exception_type() -> None:
    wire = _section(render(), "wire")
    assert "`WIRE-4.1`" in wire and "raise `ValueError`" in wire


def test_the_page_gives_every_config_key_its_type_meaning_and_example() -> None:
    page = render()
    for keys in (TRANSFER_KEYS, STAGE_KEYS, RANK_KEYS):
        for key, about in keys.items():
            assert f"| `{key}` |" in page and about.meaning.replace("|", "\\|") in page
            assert f"`{about.example!r}`" in page
    assert "| `seq_len` | `int` | no |" in page
    assert "| `side` | `Literal['source', 'target']` | yes |" in page
    for key in MODEL_KEYS:
        assert f"`{key}`" in page


def test_the_page_shows_the_fields_of_what_methods_take_and_return() -> None:
    page = render()
    for field in dataclasses.fields(Shipment):
        assert f"| `{field.name}` |" in page
    assert "| `edge` | [`Edge`](#type-edge) | *required* |" in page
    assert "| `marker` | [`HeadSlice`](#type-headslice) | *required* |" in page
    for cls in ("TransferCase", "StageLayout", "ModelShape", "RequestKV", "Payload", "Domain"):
        assert f'<a id="type-{cls.lower()}"></a>' in page, cls


@pytest.mark.parametrize(
    ("typed", "keys"),
    [(TransferConfig, TRANSFER_KEYS), (StageConfig, STAGE_KEYS), (RankConfig, RANK_KEYS)],
)
def test_the_schema_documents_exactly_the_keys_of_its_types(typed, keys) -> None:
    assert list(typed.__annotations__) == list(keys)


def test_the_stage_schema_is_the_stage_layouts_plain_form() -> None:
    assert set(STAGE_KEYS) == {f.name for f in dataclasses.fields(StageLayout)}
    assert set(MODEL_KEYS) == {f.name for f in dataclasses.fields(ModelShape)}


class _Recording(ReferenceAdapter):
    """The reference, keeping every configuration the suite hands a refusal method."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def _keep(self, method: str, config) -> None:
        self.seen.append(dict(config))
        getattr(ReferenceAdapter, method)(self, config)

    def validate_sizes(self, config) -> None:
        self._keep("validate_sizes", config)

    def validate_partition(self, config) -> None:
        self._keep("validate_partition", config)

    def validate_topology(self, config) -> None:
        self._keep("validate_topology", config)

    def validate_model(self, config) -> None:
        self._keep("validate_model", config)

    def validate_agreement(self, config) -> None:
        self._keep("validate_agreement", config)


def test_every_configuration_the_suite_hands_out_is_documented() -> None:
    """Run every check of the refusal methods through the reference, keep what they are
    handed, and hold it to the schema; the golden vectors' transfer cases too. Every
    documented key is handed by some check or vector: the schema has no dead key."""
    adapter = _Recording()
    checks = [c for c in all_checks() if set(c.needs) & set(VALIDATORS.values())]
    assert len(checks) > 20
    for check in checks:
        result = run_check(check, adapter, max_examples=10, profile="ci")
        assert result.verdict == PASSED, (check.id, result.counterexample, result.reason)
    vectors = [c.args for c in ERROR_CASES if c.op == "transfer"]
    configs = adapter.seen + vectors
    assert len(adapter.seen) > 200
    strays = {k for config in configs for k in undocumented(config)}
    assert not strays
    used = {k for config in configs for k in config}
    assert used == set(TRANSFER_KEYS)
    stage_keys = {k for c in configs for side in ("source", "target") for k in c[side]}
    assert stage_keys == set(STAGE_KEYS)


def test_a_key_the_schema_does_not_document_is_the_suites_bug_not_a_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``rank`` in the schema, the check that hands out ranks fails, naming the
    schema's file, even for the reference: a new key cannot reach adapters undocumented."""
    shrunk = {k: v for k, v in TRANSFER_KEYS.items() if k != "rank"}
    monkeypatch.setattr(transfer_config, "TRANSFER_KEYS", shrunk)
    check = get_check("STAGE-1/refuses-rank-out-of-range")
    result = run_check(check, ReferenceAdapter(), max_examples=5, profile="ci", shrink=False)
    assert result.verdict == FAILED
    assert "['rank']" in result.reason and "transfer_config.py does not document" in result.reason


def test_routing_that_ignores_the_policy_fails_the_unknown_policy_check() -> None:
    """What the page says sources must do, the suite holds it to [PLAN-4.4]."""

    class IgnoresPolicy(ReferenceAdapter):
        def sources(self, case, dst):
            return super().sources(type(case)(**{**vars(case), "policy": "lowest"}), dst)

    check = get_check("PLAN-4/refuses-unknown-policy")
    assert run_check(check, ReferenceAdapter(), profile="ci").verdict == PASSED
    result = run_check(check, IgnoresPolicy(), profile="ci", max_examples=10)
    assert result.verdict == FAILED
    assert "unknown policy" in result.reason and "[PLAN-4.4]" in result.reason
