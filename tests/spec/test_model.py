"""MODEL-1..3: model shapes, MLA, fp8 scale formats, and compatibility of two stages."""

import pytest

from kvspec.topology.model import ModelShape, check_compatible, model_mismatches


def test_mla_is_one_latent_without_v() -> None:
    model = ModelShape.mla(61, 576)
    assert (model.num_kv_heads, model.head_dim, model.latent_dim, model.kv_tensors) == (
        1,
        576,
        576,
        1,
    )
    assert model.bytes_per_token_per_head_layer == 576 * 2


def test_mha_has_k_and_v_and_no_latent() -> None:
    model = ModelShape(32, 8, 128, dtype="float32")
    assert model.bytes_per_token_per_head_layer == 2 * 128 * 4
    with pytest.raises(ValueError, match="latent_dim is defined only for MLA"):
        _ = model.latent_dim


def test_fp8_gets_the_default_scale_format() -> None:
    assert ModelShape(2, 2, 2, dtype="float8_e4m3fn").scale_format == "per_layer"
    assert ModelShape(2, 2, 2).scale_format is None


def test_compatible_models_pass() -> None:
    check_compatible(ModelShape(4, 2, 8), ModelShape(4, 2, 8))


def test_every_mismatch_is_listed() -> None:
    a = ModelShape(4, 2, 8)
    b = ModelShape.mla(5, 16, dtype="float8_e5m2")
    # an MHA model and an fp8 MLA one differ in every fact of the plain form, in its order
    assert [m.split(":")[0] for m in model_mismatches(a, b)] == list(a.to_dict())
    with pytest.raises(ValueError, match=r"disagree on 6 model fact\(s\)"):
        check_compatible(a, b)
