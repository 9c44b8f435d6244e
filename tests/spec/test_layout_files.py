"""Layout files [LAYOUT-5, SLAYOUT-1]: every preset is a file that validates under the
shipped schema and reads back as the value the old Python tables held (a fixture frozen
before the move, not regenerated), a user's file reads back as written, and a file that
is not a layout is refused naming the file, the field and why."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch

from kvspec.core.dtype_names import DTYPE_NAMES
from kvspec.memory.cache_layout import get_layout, layer_views
from kvspec.memory.layout_files import (
    LayoutFileError,
    dumps,
    layout_from_data,
    layout_from_json,
    layout_to_data,
    read_layout_file,
    schema,
)
from kvspec.memory.layout_files import format as file_format
from kvspec.memory.layout_model import (
    AXES,
    FIELD_DTYPES,
    STATE_AXES,
    CacheLayout,
    Field,
    Source,
    StateCacheLayout,
)
from kvspec.memory.presets import LAYOUT_PRESETS, PRESETS, STATE_LAYOUT_PRESETS
from kvspec.memory.state_cache import get_state_layout
from tests.user_layouts import engine_hnd

FROZEN = Path(__file__).parent / "fixtures" / "presets_before_files.json"
"""dataclasses.asdict of every preset at fc2919a, before the presets were files."""

ROOT = resources.files("kvspec.memory").joinpath("layouts")


def _plain(value: object) -> Any:
    return json.loads(json.dumps(value))


def _file_names() -> list[str]:
    return sorted(p.name for p in ROOT.joinpath("presets").iterdir() if p.name.endswith(".json"))


@pytest.mark.parametrize("table", ["layouts", "state_layouts"])
def test_the_presets_are_the_old_tables_value_for_value(table: str) -> None:
    """Each of the presets the Python tables held is its file's value, and they keep
    their order; presets added since sit among them."""
    frozen = json.loads(FROZEN.read_text())[table]
    now = {p.name: p for p in (LAYOUT_PRESETS if table == "layouts" else STATE_LAYOUT_PRESETS)}
    assert len(frozen) == (19 if table == "layouts" else 2)
    added = {"planes": [], "side": [], "fixed_block_size": None, "head_dim_multiple": None}
    for old in frozen:
        value = _plain(dataclasses.asdict(now[old["name"]]))
        if table == "layouts":  # fields CacheLayout gained since then keep their defaults
            assert {k: value.pop(k) for k in added} == added, old["name"]
            # what the value holds beside its identity: where it was read, its layers' value
            assert value.pop("origin") is None, old["name"]
            held = value.pop("layer_form")
            per_layer = value["per_layer"]
            assert held == (
                None if per_layer is None else _plain(dataclasses.asdict(PRESETS[per_layer]))
            )
        assert value == old, old["name"]
    names = [p["name"] for p in frozen]
    assert [n for n in now if n in names] == names


def test_the_index_lists_every_preset_file_once_in_order() -> None:
    index = json.loads(ROOT.joinpath("index.json").read_text("utf-8"))
    listed = [*index["layouts"], *index["state_layouts"]]
    assert len(set(listed)) == len(listed)
    assert sorted(f"{n}.json" for n in listed) == _file_names()
    assert index["layouts"] == [p.name for p in LAYOUT_PRESETS]


@pytest.mark.parametrize("name", [n.removesuffix(".json") for n in _file_names()])
def test_each_preset_file_is_what_the_writer_writes(name: str) -> None:
    text = ROOT.joinpath("presets", f"{name}.json").read_text("utf-8")
    layout = layout_from_json(text, name, known=PRESETS)
    assert layout.name == name
    assert dumps(layout) == text  # the files are the writer's output, byte for byte
    assert layout_from_data(layout_to_data(layout), name, known=PRESETS) == layout


@pytest.mark.parametrize("name", [n.removesuffix(".json") for n in _file_names()])
def test_each_preset_file_validates_under_the_shipped_schema(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(schema())
    validator.validate(json.loads(ROOT.joinpath("presets", f"{name}.json").read_text("utf-8")))


def _enum(defs: dict[str, Any], name: str) -> list[Any]:
    return list(defs[name]["enum"])


def test_the_schema_and_the_reader_name_the_same_fields_and_values() -> None:
    """The reader enforces the schema by itself: its lists are the schema's."""
    published = schema()
    defs = published["$defs"]
    cache, state = defs["cache"], defs["state"]
    assert cache["required"] == list(file_format.CACHE_REQUIRED)
    assert list(cache["properties"]) == ["$schema", *file_format.CACHE_FIELDS]
    assert state["required"] == list(file_format.STATE_REQUIRED)
    assert list(state["properties"]) == ["$schema", *file_format.STATE_FIELDS]
    assert defs["source"]["required"] == list(file_format.SOURCE_REQUIRED)
    assert list(defs["source"]["properties"]) == list(file_format.SOURCE_FIELDS)
    assert list(defs["field"]["properties"]) == list(file_format.RECORD_FIELDS)
    assert _enum(defs, "axis") == list(AXES)
    assert _enum(defs, "field_dtype") == list(FIELD_DTYPES)
    assert _enum(defs, "cache_dtype") == list(DTYPE_NAMES)
    assert defs["state_axes"]["items"]["enum"] == list(STATE_AXES)
    assert published["properties"]["kind"]["enum"] == list(file_format.KINDS)
    assert cache["properties"]["kv_tensors"]["enum"] == [1, 2, None]
    # CacheLayout's fields are the file's, less kind (what the file holds); the fields
    # outside its identity (compare=False) say where it was read, not what it is
    fields = [f.name for f in dataclasses.fields(CacheLayout) if f.compare]
    assert sorted(fields) == sorted(set(file_format.CACHE_FIELDS) - {"kind"})
    state_fields = [f.name for f in dataclasses.fields(StateCacheLayout)]
    assert sorted(state_fields) == sorted(set(file_format.STATE_FIELDS) - {"kind"})
    assert [f.name for f in dataclasses.fields(Source)] == list(file_format.SOURCE_FIELDS)
    assert [f.name for f in dataclasses.fields(Field)] == list(file_format.RECORD_FIELDS)


USER: dict[str, Any] = engine_hnd("spec_user_hnd")


def test_a_user_file_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "user.json"
    path.write_text(json.dumps(USER))
    layout = read_layout_file(path, known=PRESETS)
    assert isinstance(layout, CacheLayout)
    assert layout == CacheLayout(
        name="spec_user_hnd",
        shape=USER["shape"],
        axes=("blocks", "heads", "slots", "dim"),
        kv_tensors=2,
        tuple_form=False,
        record=(Field("k"), Field("v")),
        logical=("blocks", "slots", "heads", "dim"),
        source=Source(
            "an-engine",
            "engine/cache.py: allocate_kv",
            "2.1",
            "K then V in the last axis, heads outside block slots",
            "the page padding",
        ),
    )
    assert layout.stride_order == (0, 2, 1, 3) and layout.packed
    assert layout_to_data(layout) == USER
    # wherever a preset name is taken, the path is; the value remembers where it was read
    assert get_layout(str(path)) == layout and get_layout(str(path)).ref == str(path)
    assert layout.ref == "spec_user_hnd"  # read_layout_file is no reference's reader
    # reading the file registered nothing: its name is no reference [LAYOUT-1]
    with pytest.raises(ValueError, match=r"unknown cache layout 'spec_user_hnd'"):
        get_layout("spec_user_hnd")
    assert get_layout(str(path)).information("bfloat16", 8) == PRESETS[
        "vllm_packed_hnd"
    ].information("bfloat16", 8)


def test_a_user_state_file_reads_where_a_state_preset_name_does(tmp_path: Path) -> None:
    data = layout_to_data(STATE_LAYOUT_PRESETS[1])
    data["name"] = "spec_user_conv"
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(data))
    state = get_state_layout(str(path))
    assert state.conv_axes == STATE_LAYOUT_PRESETS[1].conv_axes and state.dim_first
    with pytest.raises(LayoutFileError, match=r"field 'kind' is 'state'.*KV cache layout"):
        get_layout(str(path))


def test_a_file_may_not_give_a_preset_s_name_to_another_layout(
    tmp_path: Path,
) -> None:
    taken = {**USER, "name": "vllm_packed_hnd"}  # the preset's name, NHD's stride order
    path = tmp_path / "taken.json"
    path.write_text(json.dumps(taken))
    with pytest.raises(
        LayoutFileError, match=r"taken.json: field 'name' is 'vllm_packed_hnd'.*ambiguous"
    ):
        get_layout(str(path))
    same = layout_to_data(PRESETS["vllm_packed_hnd"])  # the very preset: it is that preset
    (tmp_path / "same.json").write_text(json.dumps(same))
    assert get_layout(str(tmp_path / "same.json")) == PRESETS["vllm_packed_hnd"]
    # two files may give one name to two layouts: no name is registered, each reader
    # holds its own value, and each is written back as its own file
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({**USER, "name": "spec_twice"}))
    second.write_text(json.dumps({**USER, "name": "spec_twice", "logical": USER["axes"]}))
    one, two = get_layout(str(first)), get_layout(str(second))
    assert one.name == two.name == "spec_twice" and one != two
    assert (one.ref, two.ref) == (str(first), str(second))
    assert one.stride_order != two.stride_order


def test_a_cross_layer_and_a_record_file_read_as_their_presets_do(tmp_path: Path) -> None:
    for preset in ("trtllm_pool", "vllm_pth_nhd", "flashmla_fp8", "sglang_mha", "token_major"):
        data = layout_to_data(PRESETS[preset])
        data["name"] = f"spec_{preset}"
        path = tmp_path / f"{preset}.json"
        path.write_text(json.dumps(data))
        assert get_layout(str(path)) == dataclasses.replace(PRESETS[preset], name=f"spec_{preset}")


def _with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(USER)
    for key, value in changes.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return data


_DROP = object()

# (case id, the file's data, the field named, what the refusal says, whether the schema
# alone refuses it: False for the rules between fields, which no schema states)
BAD: list[tuple[str, Any, str, str, bool]] = [
    ("not-an-object", ["axes"], "", r"holds a JSON array", True),
    ("no-kind", _with(kind=_DROP), "kind", r"is missing", True),
    ("unknown-kind", _with(kind="tensor"), "kind", r"is 'tensor'; it must be one of", True),
    ("unknown-field", _with(axis=["dim"]), "axis", r"is not a field of a cache layout", True),
    ("missing-axes", _with(axes=_DROP), "axes", r"is missing", True),
    (
        "axis-twice",
        _with(axes=["blocks", "slots", "slots", "dim"]),
        "axes",
        r"names 'slots' twice",
        True,
    ),
    (
        "unknown-axis",
        _with(axes=["blocks", "rows", "dim"]),
        "axes[1]",
        r"is 'rows'; it must be one of",
        True,
    ),
    ("kv-tensors-3", _with(kv_tensors=3), "kv_tensors", r"is 3; it must be 2", True),
    ("kv-tensors-true", _with(kv_tensors=True), "kv_tensors", r"is true", True),
    ("tuple-form-string", _with(tuple_form="no"), "tuple_form", r"must be true or false", True),
    (
        "bad-dtype",
        _with(record=[{"name": "k", "dtype": "int4"}, {"name": "v"}]),
        "record[0].dtype",
        r"'int4'",
        True,
    ),
    (
        "zero-width",
        _with(record=[{"name": "k", "width": 0}, {"name": "v"}]),
        "record[0].width",
        r"whole number from 1 to 65536",
        True,
    ),
    (
        "huge-width",
        _with(record=[{"name": "k", "width": 10**12}, {"name": "v"}]),
        "record[0].width",
        r"is 1000000000000; it must be a whole number from 1 to 65536",
        True,
    ),
    (
        # Arabic-Indic three: str.isdigit() takes it, the schema's [0-9] does not
        "unicode-digit-width",
        _with(record=[{"name": "k", "width": "head_dim/\u0663"}, {"name": "v"}]),
        "record[0].width",
        r"a width is a whole number",
        True,
    ),
    (
        "huge-width-divisor",
        _with(record=[{"name": "k", "width": "head_dim/65537"}, {"name": "v"}]),
        "record[0].width",
        r"'head_dim/N' for a whole N from 1 to 65536",
        True,
    ),
    (
        "huge-block-size",
        _with(fixed_block_size=2**40),
        "fixed_block_size",
        r"is 1099511627776; it must be a whole number from 1 to 65536",
        True,
    ),
    ("dotted-name", _with(name="my.layout"), "name", r"no dots", True),
    (
        "source-unknown-field",
        _with(source={**USER["source"], "release": "1"}),
        "source.release",
        r"not a field of a source",
        True,
    ),
    (
        "source-missing-file",
        _with(source={k: v for k, v in USER["source"].items() if k != "file"}),
        "source.file",
        r"is missing",
        True,
    ),
    (
        "logical-not-permutation",
        _with(logical=["blocks", "heads", "tokens", "dim"]),
        "logical",
        r"not a permutation of the axes",
        False,
    ),
    (
        "dim-not-last",
        _with(axes=["blocks", "dim", "slots", "heads"], logical=_DROP),
        "axes",
        r"the last axis is 'dim'",
        False,
    ),
    (
        "tokens-and-blocks",
        _with(axes=["blocks", "tokens", "heads", "dim"], logical=_DROP),
        "axes",
        r"both 'tokens' and 'blocks'",
        False,
    ),
    (
        "no-blocks",
        _with(axes=["slots", "heads", "dim"], logical=_DROP),
        "axes",
        r"neither 'blocks' nor 'tokens'",
        False,
    ),
    (
        "kv-axis-and-record",
        _with(axes=["kv", "blocks", "heads", "slots", "dim"], logical=_DROP),
        "record",
        r"would be ignored",
        False,
    ),
    (
        "kv-axis-and-tuple",
        _with(
            axes=["kv", "blocks", "heads", "slots", "dim"],
            logical=_DROP,
            record=_DROP,
            tuple_form=True,
        ),
        "tuple_form",
        r"not both",
        False,
    ),
    (
        "kv-axis-for-a-latent",
        _with(axes=["kv", "blocks", "slots", "dim"], logical=_DROP, record=_DROP, kv_tensors=1),
        "axes",
        r"kv_tensors is 1",
        False,
    ),
    ("k-and-v-nowhere", _with(record=_DROP), "record", r"must name them", False),
    (
        "k-without-v",
        _with(record=[{"name": "k"}, {"name": "k_scale", "dtype": "float32", "width": 1}]),
        "record",
        r"names 'k': a packed record holds both",
        False,
    ),
    (
        "field-twice",
        _with(record=[{"name": "k"}, {"name": "v"}, {"name": "k"}]),
        "record",
        r"names the field 'k' twice",
        False,
    ),
    (
        "latent-tuple",
        _with(kv_tensors=1, tuple_form=True, record=_DROP),
        "tuple_form",
        r"a latent is one tensor",
        False,
    ),
    (
        "element-without-dtypes",
        _with(element="uint8"),
        "element",
        r"must say the cache dtypes",
        False,
    ),
    (
        "fixed-record-no-head-dim",
        _with(kv_tensors=1, record=[{"name": "nope", "dtype": "uint8", "width": 16}]),
        "fixed_head_dim",
        r"is missing",
        False,
    ),
    ("head-dim-ignored", _with(fixed_head_dim=64), "fixed_head_dim", r"would be ignored", False),
    (
        "layers-without-per-layer",
        _with(axes=["blocks", "layers", "heads", "slots", "dim"], logical=_DROP),
        "per_layer",
        r"is missing",
        False,
    ),
    (
        "per-layer-unknown",
        _with(axes=["blocks", "layers", "heads", "slots", "dim"], logical=_DROP, per_layer="nope"),
        "per_layer",
        r"'nope', which is no per-layer preset",
        False,
    ),
    (
        "per-layer-other-axes",
        _with(
            axes=["blocks", "layers", "heads", "slots", "dim"],
            logical=_DROP,
            per_layer="vllm_packed_nhd",
        ),
        "per_layer",
        r"whose axes is \[blocks, slots, heads, dim\]",
        False,
    ),
    (
        "per-layer-without-layers",
        _with(per_layer="vllm_packed_hnd"),
        "per_layer",
        r"no 'layers' axis",
        False,
    ),
    (  # a tuple per-layer preset takes its two tensors from a K/V axis, and this has none
        "per-layer-tuple-without-kv-axis",
        _with(axes=["tokens", "layers", "heads", "dim"], logical=_DROP, per_layer="sglang_mha"),
        "per_layer",
        r"names 'sglang_mha', whose tuple_form is true, but this layout's is false",
        False,
    ),
    (  # the K/V axis given, the rest must still be the tuple's [tokens, heads, dim]
        "per-layer-tuple-other-axes",
        _with(
            axes=["kv", "layers", "blocks", "slots", "heads", "dim"],
            logical=_DROP,
            record=_DROP,
            per_layer="sglang_mha",
        ),
        "per_layer",
        r"whose axes is \[tokens, heads, dim\]",
        False,
    ),
]


def test_a_cross_layer_file_whose_layers_are_tuples_reads_each_as_the_tuple(
    tmp_path: Path,
) -> None:
    """LAYOUT-5.2: a K/V axis beside a layers axis, each layer a tuple (K, V) of views, as
    SGLang's host and page-major pools keep their layers [sglang 0.5.23]."""
    data = _with(
        name="my_pool",
        axes=["layers", "kv", "tokens", "heads", "dim"],
        logical=_DROP,
        record=_DROP,
        per_layer="sglang_mha",
    )
    path = tmp_path / "my_pool.json"
    path.write_text(json.dumps(data))
    layout = read_layout_file(path, known=PRESETS)
    assert isinstance(layout, CacheLayout) and layout.per_layer == "sglang_mha"
    cache = torch.arange(3 * 2 * 8 * 2 * 4, dtype=torch.float32).reshape(3, 2, 8, 2, 4)
    layers = layer_views(cache, layout, block_size=4)
    assert all(isinstance(layer, tuple) and len(layer) == 2 for layer in layers)
    assert torch.equal(layers[2][1], cache[2, 1])  # layer 2's V: index 1 of its K/V axis
    assert layers[2][1].data_ptr() == cache[2, 1].data_ptr()  # a view, nothing copied


@pytest.mark.parametrize(
    ("data", "field", "why", "by_schema"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_a_bad_file_is_refused_naming_the_file_the_field_and_why(
    tmp_path: Path, data: Any, field: str, why: str, by_schema: bool
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    at = f"field '{field}' " if field else ""
    with pytest.raises(LayoutFileError) as caught:
        read_layout_file(path, known=PRESETS)
    message = str(caught.value)
    assert message.startswith(f"layout file {path}: {at}"), message
    assert "\n" not in message
    assert re.search(why, message), message
    jsonschema = pytest.importorskip("jsonschema")
    errors = list(jsonschema.Draft202012Validator(schema()).iter_errors(data))
    assert bool(errors) == by_schema, (errors, "the schema and the reader disagree")


@pytest.mark.parametrize(
    ("text", "field", "why"),
    [
        (b'{"kind": "cache", "kind": "state"}', "kind", "is given twice"),
        (b'{"kind": "cache", ', "", "is not JSON"),
        (b'{"kind": NaN}', "", "is not JSON"),
        (b"\xff\xfe", "", "is not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "", "nests arrays or objects more than 8 deep"),
        (b'{"kind": "cache", "a": ' + b'{"a": ' * 9 + b"1" + b"}" * 10, "", "nests"),
        (b'{"kind": "cache", "fixed_block_size": 1' + b"0" * 4_500 + b"}", "", "is not JSON"),
    ],
    ids=["key-twice", "truncated", "nan", "not-utf8", "deep-arrays", "deep-objects", "long-number"],
)
def test_a_file_that_is_not_json_is_refused_naming_the_file(
    tmp_path: Path, text: bytes, field: str, why: str
) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(text)
    at = f"field '{field}' " if field else ""
    with pytest.raises(LayoutFileError, match=rf"^layout file {path}: {at}{why}"):
        read_layout_file(path)


def test_a_missing_or_huge_file_is_refused_unread(tmp_path: Path) -> None:
    with pytest.raises(LayoutFileError, match=r"nothere.json: cannot be read"):
        get_layout(str(tmp_path / "nothere.json"))
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (file_format.MAX_FILE_BYTES + 1))
    with pytest.raises(LayoutFileError, match=r"huge.json: is over"):
        read_layout_file(huge)


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path: Path) -> None:
    """The depth scan skips strings (escaped quotes included): a deep-looking name is
    judged by the schema as a name, not refused as nesting."""
    path = tmp_path / "brackets.json"
    path.write_text(json.dumps({**USER, "name": '[[[[[[[[[["\\' + "]" * 10}))
    with pytest.raises(LayoutFileError, match=r"field 'name' is .*a name is up to"):
        read_layout_file(path, known=PRESETS)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_path_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path, kind: str) -> None:
    """A FIFO named as a layout file is refused at once, not read until a writer comes
    (the reader would block forever); a directory likewise names what it is."""
    path = tmp_path / "pipe.json"
    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs on this platform")
        os.mkfifo(path)
        named = "a FIFO"
    else:
        path.mkdir()
        named = "a directory"
    with pytest.raises(LayoutFileError, match=rf"pipe.json: is {named}.*not a regular file"):
        read_layout_file(path)


def test_the_docs_example_file_is_the_one_shown_and_reads() -> None:
    """docs/layouts.md shows examples/layouts/my_engine_hnd.json verbatim, in the
    writer's form, and it is a layout kvspec reads."""
    from tests.paths import ROOT

    example = ROOT / "examples" / "layouts" / "my_engine_hnd.json"
    page = (ROOT / "docs" / "layouts.md").read_text()
    assert f"```json\n{example.read_text()}```" in page
    layout = read_layout_file(example, known=PRESETS)
    assert dumps(layout) == example.read_text()


def test_every_preset_name_fits_the_listing_column() -> None:
    """kvspec layouts lists names in a 24-column field: a preset's name leaves a space."""
    for name in [*PRESETS, *(p.name for p in STATE_LAYOUT_PRESETS)]:
        assert len(name) <= 23, name
