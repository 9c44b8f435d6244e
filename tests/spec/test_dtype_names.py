"""The torch-free dtype names agree with the torch dtypes they stand for [DTYPE-1]."""

from __future__ import annotations

import pytest

from kvspec.core import dtype_names
from kvspec.tensors import dtypes


def test_the_names_are_the_torch_dtypes_keys_in_order() -> None:
    assert tuple(dtypes.DTYPES) == dtype_names.DTYPE_NAMES


@pytest.mark.parametrize("name", dtype_names.DTYPE_NAMES)
def test_widths_without_torch_are_torchs(name: str) -> None:
    assert dtype_names.itemsize(name) == dtypes.DTYPES[name].itemsize
    assert dtype_names.FLOAT_FORMATS[name].bits == 8 * dtypes.DTYPES[name].itemsize


@pytest.mark.parametrize(
    "name", ["FP8_DTYPES", "FLOAT_FORMATS", "FloatFormat", "check_dtype", "itemsize"]
)
def test_dtypes_still_exports_every_name_it_had(name: str) -> None:
    assert getattr(dtypes, name) is getattr(dtype_names, name)


@pytest.mark.parametrize("bad", ["int8", "float64", ["bfloat16"], None])
def test_an_unknown_dtype_is_refused_with_the_allowed_names(bad: object) -> None:
    allowed = "float32, float16, bfloat16, float8_e4m3fn, float8_e5m2"
    with pytest.raises(ValueError, match=f"dtype must be one of {allowed}; got"):
        dtype_names.check_dtype(bad)
    with pytest.raises(ValueError, match="dtype must be one of"):
        dtype_names.itemsize(bad)  # type: ignore[arg-type]
