"""List the cache layouts kvspec knows, with their shape, stride order and source.

Every layout is a preset of one model: the physical axes of each stored tensor, the
engine's logical order (its stride order), where K and V live, the record of each
cell (inline scales included), an optional layers axis [LAYOUT-5, LAYOUT-6].

examples:
  kvspec layouts                                  every preset, one entry each
  kvspec layouts vllm_pth_hnd                     one preset in full, with its source
  kvspec layouts my_layout.json                   a layout file, checked, in full
  kvspec layouts --convert vllm_packed_hnd sglang_mha --to-block-size 32
  kvspec layouts --convert vllm_pth_hnd vllm_packed_hnd     # refused: inline scales
  kvspec layouts --json -
  kvspec layouts --which 2x2x16x16 --heads 2      every layout a [2, 2, 16, 16] cache could be
  kvspec layouts vllm_conv_ds --model qwen3-next-80b-a3b --tp 4 --rank 1

State layouts (vllm_conv_sd, vllm_conv_ds) place a Mamba/GDN layer's state in one page
per block [SLAYOUT-1]; with --model NAME (a hybrid preset) one of them prints, for each
state group, the page of attention-TP rank --rank of --tp: its tensors, their byte
offsets, and where each part's units start and how many reads they take [SLAYOUT-2].

--convert converts a random cache of the stated size and back, and says whether the
round trip is bit-exact. A pair that holds different information, or a block size that
does not divide the slots, exits with status 2 and names the rule.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from kvspec.console.args import MAX_HEAD_DIM, MAX_HEADS, int_in, quote
from kvspec.console.output import STDOUT, add_json_option, check_writable, write_json
from kvspec.core.dtype_names import DTYPE_NAMES
from kvspec.topology.model import ModelShape
from kvspec.topology.model_presets import PRESETS as MODEL_PRESETS
from kvspec.topology.model_presets import model_preset

# The layouts and their tensors (and so torch) are imported where they are used, so that
# `kvspec --help` and every other command start without them.
if TYPE_CHECKING:
    from kvspec.memory.cache_layout import CacheLayout
    from kvspec.memory.layout_model import StateCacheLayout

NAME = "layouts"
HELP = "list the cache layout presets (shape, stride order, source); convert between two"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", help="show this preset, or the layout in this layout file, in full"
    )
    parser.add_argument(
        "--convert",
        nargs=2,
        metavar=("A", "B"),
        help="convert a cache from preset (or layout file) A to B",
    )
    parser.add_argument(
        "--which",
        nargs="+",
        metavar="SHAPE",
        type=shape_arg,
        help="every layout a cache of this shape (AxBxC..., several for a tuple) could be; "
        "--heads, --head-dim, --block-size narrow it",
    )
    size = parser.add_argument_group("the cache --convert makes (or what --which knows)")
    size.add_argument("--heads", type=int_in(1, MAX_HEADS), help="KV heads (2)")
    size.add_argument("--head-dim", type=int_in(1, MAX_HEAD_DIM), help="head_dim or latent (8)")
    size.add_argument("--blocks", type=int_in(1, 4096), default=4, help="blocks (4)")
    size.add_argument("--block-size", type=int_in(1, 4096), help="A's block size (16)")
    size.add_argument(
        "--to-block-size", type=int_in(1, 4096), help="B's block size (A's)", metavar="N"
    )
    size.add_argument("--layers", type=int_in(1, 64), default=2, help="cross-layer layers (2)")
    size.add_argument("--dtype", choices=DTYPE_NAMES, help="cache dtype (bfloat16, or A's)")
    state = parser.add_argument_group("a state layout's page (NAME a state layout)")
    state.add_argument("--model", choices=tuple(MODEL_PRESETS), help="a hybrid preset")
    state.add_argument("--tp", type=int_in(1, 1024), default=1, help="attention TP (1)")
    state.add_argument("--rank", type=int_in(0, 1023), default=0, help="attention-TP rank (0)")
    state.add_argument(
        "--page-size", type=int_in(1, 2**40), help="bytes per page (the state's own)", metavar="B"
    )
    add_json_option(parser, "the presets (or the conversion)")


def shape_arg(text: str) -> list[int]:
    """An argparse ``type``: a tensor shape written ``2x16x4x8`` (or with commas)."""
    parts = text.replace(",", "x").split("x")
    if not 1 <= len(parts) <= 8 or not all(p.isdigit() and len(p) <= 9 for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected a shape such as 2x16x4x8 (1 to 8 sizes), got {quote(text)}"
        )
    return [int(p) for p in parts]


def which_report(args: argparse.Namespace) -> dict[str, Any]:
    """Every layout a cache of the ``--which`` shape(s) could be, with its reading [LAYOUT-4]."""
    from kvspec.memory.layout_readings import readings

    dtype = args.dtype or "bfloat16"
    known = {"heads": args.heads, "head_dim": args.head_dim, "block_size": args.block_size}
    found = readings(args.which, dtype=dtype, **known)
    return {
        "shapes": args.which,
        "dtype": dtype,
        "known": {k: v for k, v in known.items() if v is not None},
        "layouts": [
            {
                "name": r.layout,
                "dtype": r.dtype,
                "num_blocks": r.shape.num_blocks if r.page_size_stated else None,
                "block_size": r.shape.block_size if r.page_size_stated else None,
                "token_rows": r.shape.slots,
                "heads": r.shape.heads,
                "head_dim": r.shape.head_dim,
                "layers": r.shape.layers,
                "kv": r.shape.kv,
            }
            for r in found
        ],
    }


def render_which(report: dict[str, Any]) -> str:
    shapes = " and ".join(str(s) for s in report["shapes"])
    known = ", ".join(f"{k} {v}" for k, v in report["known"].items())
    found = report["layouts"]
    lines = [
        f"a cache of {'tensors' if len(report['shapes']) > 1 else 'a tensor'} {shapes} "
        f"({report['dtype']}{', ' + known if known else ''}) could be {len(found)} "
        f"layout{'s' if len(found) != 1 else ''} [LAYOUT-4]:"
    ]
    for r in found:
        blocks = (
            f"{r['num_blocks']} blocks of {r['block_size']}"
            if r["block_size"] is not None
            else f"a pool of {r['token_rows']} token rows (any page size that divides them)"
        )
        what = (
            f"latent {r['head_dim']}" if r["kv"] == 1 else f"{r['heads']} heads x {r['head_dim']}"
        )
        layers = f", {r['layers']} layers" if r["layers"] > 1 else ""
        dtype = f" ({r['dtype']})" if r["dtype"] != report["dtype"] else ""
        lines.append(f"  {r['name']:<26}{blocks}, {what}{layers}{dtype}")
    if len(found) > 1:
        lines.append(
            "the shape alone cannot tell them apart: name the layout (kvspec layouts NAME), "
            "or state --heads, --head-dim, --block-size"
        )
    return "\n".join(lines)


def describe(layout: CacheLayout) -> dict[str, Any]:
    """One preset as plain data: shape, stride order, placement, record and source."""
    logical = layout.logical or layout.axes
    return {
        "name": layout.name,
        "shape": layout.shape,
        "physical_axes": list(layout.axes),
        "logical_axes": list(logical),
        "stride_order": list(layout.stride_order),
        "kv": placement(layout),
        "record": [
            {"field": f.name, "dtype": f.dtype or "cache dtype", "width": f.width or "head_dim"}
            for f in layout.fields()
        ],
        "cross_layer": layout.per_layer,
        "planes": [{"field": p.field, "axes": list(p.axes), "unit": p.unit} for p in layout.planes],
        "side": [
            {"field": s.field.name, "of": s.of, "axes": list(s.plane.axes), "unit": s.plane.unit}
            for s in layout.side
        ],
        "dtypes": list(layout.dtypes) if layout.dtypes else "any cache dtype",
        "source": layout.source.to_dict() if layout.source else None,
    }


def placement(layout: CacheLayout) -> str:
    if layout.kv_axis is not None:
        return "K/V axis"
    if layout.side:
        return "(K, V) tuple, scales in side tensors"
    if layout.tuple_form:
        return "(K, V) tuple" if layout.kv_tensors == 2 else "tuple"
    if layout.planes:
        return "per-block planes"
    if layout.packed:
        return "packed in the last axis"
    return "one latent"


def _order(layout: CacheLayout) -> str:
    order = layout.stride_order
    if order == tuple(range(len(order))):
        return "identity"
    return f"{order} of logical [{', '.join(layout.logical or ())}]"


def _source(layout: CacheLayout) -> str:
    if layout.source is None:
        return "kvspec's own form"
    return f"{layout.source.project} {layout.source.version}"


def render_list() -> str:
    from kvspec.memory.cache_layout import PRESETS
    from kvspec.memory.presets import STATE_PRESETS

    lines = [f"{len(PRESETS)} cache layouts (kvspec layouts NAME for one in full):", ""]
    for layout in PRESETS.values():
        lines.append(f"{layout.name:<24}{layout.shape}")
        lines.append(
            f"{'':<24}{placement(layout)}; stride order {_order(layout)}; {_source(layout)}"
        )
    lines += ["", f"{len(STATE_PRESETS)} state cache layouts (Mamba, GDN) [SLAYOUT-1]:", ""]
    for state in STATE_PRESETS.values():
        lines.append(f"{state.name:<24}{state.shape}")
        lines.append(
            f"{'':<24}conv [{', '.join(state.conv_axes)}]; stride order {state.stride_order} of "
            f"logical [{', '.join(state.logical)}]; {state.source.project} {state.source.version}"
        )
    return "\n".join(lines)


def describe_state(layout: StateCacheLayout) -> dict[str, Any]:
    """One state layout as plain data [SLAYOUT-1]."""
    return {
        "name": layout.name,
        "shape": layout.shape,
        "conv_physical_axes": list(layout.conv_axes),
        "conv_logical_axes": list(layout.logical),
        "stride_order": list(layout.stride_order),
        "dim_first": layout.dim_first,
        "source": layout.source.to_dict(),
    }


def state_pages(args: argparse.Namespace, layout: StateCacheLayout) -> list[dict[str, Any]]:
    """The page of every state group of ``--model`` at ``--rank`` of ``--tp`` [SLAYOUT-1, -2]."""
    from kvspec.memory.state_cache import element_offset, state_page, state_runs

    model: ModelShape = model_preset(args.model)
    pages = []
    for index, group in enumerate(model.layer_groups):
        if group.per_token or not group.parts():
            continue
        where = {"attn_tp": args.tp, "attn_tp_rank": args.rank, "page_size": args.page_size}
        page = state_page(layout, model, index, **where)
        parts = []
        for part in group.parts():
            units = page.units[part.name]
            first = element_offset(page, block=0, part=part.name, unit=units.start, element=0)
            runs = state_runs(layout, model, index, **where, block=0, part=part.name, units=units)
            parts.append(
                {
                    "part": part.name,
                    "units": [units.start, units.stop],
                    "first_byte": first,
                    "bytes": sum(n for _, n in runs),
                    "reads": len(runs),
                }
            )
        pages.append(
            {
                "group": index,
                "facts": group.describe(),
                "page_size": page.page_size,
                "tensors": [
                    {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "offset": t.offset}
                    for t in page.tensors
                ],
                "parts": parts,
            }
        )
    return pages


def render_state(info: dict[str, Any], args: argparse.Namespace) -> str:
    s = info["source"]
    lines = [
        f"{info['name']}  {info['shape']}",
        f"  conv axes       [{', '.join(info['conv_physical_axes'])}] (stride order "
        f"{tuple(info['stride_order'])} of logical [{', '.join(info['conv_logical_axes'])}])",
        f"  source          {s['project']} {s['version']}: {s['file']}",
        f"  confirmed       {s['confirmed']}",
    ]
    if s["unconfirmed"]:
        lines.append(f"  not confirmed   {s['unconfirmed']}")
    for page in info.get("pages", ()):
        lines += [
            "",
            f"{args.model} group {page['group']} at attention-TP rank {args.rank} of {args.tp}: "
            f"page {page['page_size']} B per block",
        ]
        for t in page["tensors"]:
            lines.append(f"  {t['name']:<5} {t['dtype']:<9} {t['shape']} at byte {t['offset']}")
        lines.append("  part  units          first byte       bytes  reads")
        for p in page["parts"]:
            units = f"{p['units'][0]}..{p['units'][1] - 1}"
            at, size, reads = p["first_byte"], p["bytes"], p["reads"]
            lines.append(f"  {p['part']:<5} {units:<14} {at:>10} {size:>11} {reads:>6}")
    return "\n".join(lines)


def render_one(layout: CacheLayout) -> str:

    info = describe(layout)
    lines = [
        f"{layout.name}  {layout.shape}",
        f"  physical axes   [{', '.join(info['physical_axes'])}]",
        f"  logical axes    [{', '.join(info['logical_axes'])}] (stride order "
        f"{tuple(info['stride_order'])})",
        f"  K and V         {info['kv']}",
        "  record          "
        + " | ".join(f"{r['field']} ({r['width']} x {r['dtype']})" for r in info["record"]),
        f"  cache dtypes    {', '.join(layout.dtypes) if layout.dtypes else 'any'}",
    ]
    for name, entries in (("planes", info["planes"]), ("side tensors", info["side"])):
        for i, e in enumerate(entries):
            split = f", slot t at (t // {e['unit']}, t % {e['unit']})" if e["unit"] else ""
            lines.append(
                f"  {name if i == 0 else '':<15} {e['field']} [{', '.join(e['axes'])}]{split}"
            )
    if layout.per_layer:
        tuple_of = layout.kv_axis is not None and layout.layer_layout.tuple_form
        views = "(K, V): index 0 and 1 of its K/V axis, views" if tuple_of else "(a view)"
        lines.append(f"  each layer      reads as {layout.per_layer} {views}")
    if layout.source is None:
        lines.append("  source          kvspec's own form (no engine's)")
    else:
        s = layout.source
        lines += [
            f"  source          {s.project} {s.version}: {s.file}",
            f"  confirmed       {s.confirmed}",
        ]
        if s.unconfirmed:
            lines.append(f"  not confirmed   {s.unconfirmed}")
    return "\n".join(lines)


def _named(name: str) -> CacheLayout | StateCacheLayout:
    """The layout ``name`` names: a cache or state preset, or a layout file of either kind
    [LAYOUT-5, SLAYOUT-1]."""
    from kvspec.memory.cache_layout import get_layout
    from kvspec.memory.layout_refs import is_layout_file, read_file
    from kvspec.memory.presets import STATE_PRESETS

    if name in STATE_PRESETS:
        return STATE_PRESETS[name]
    return read_file(name) if is_layout_file(name) else get_layout(name)


def run(args: argparse.Namespace) -> int:
    from kvspec.memory.cache_layout import PRESETS, get_layout
    from kvspec.memory.layout_model import StateCacheLayout
    from kvspec.memory.presets import STATE_PRESETS

    try:
        check_writable(args.json)
        if args.convert:
            report = convert_report(args)
            text = render_convert(report)
        elif args.which:
            report = which_report(args)
            if not report["layouts"]:
                raise ValueError(
                    f"a cache of {' and '.join(map(str, args.which))} fits no cache layout "
                    "(kvspec layouts lists them) [LAYOUT-4]"
                )
            text = render_which(report)
        elif args.name and isinstance(named := _named(args.name), StateCacheLayout):
            report = describe_state(named)
            if args.model:
                report["pages"] = state_pages(args, named)
            text = render_state(report, args)
        elif args.name:
            layout = get_layout(named)
            report, text = describe(layout), render_one(layout)
        else:
            report = {
                "layouts": [describe(lay) for lay in PRESETS.values()],
                "state_layouts": [describe_state(lay) for lay in STATE_PRESETS.values()],
            }
            text = render_list()
    except ValueError as error:
        print(f"kvspec layouts: refused: {error}", file=sys.stderr)
        return 2
    if args.json != STDOUT:
        print(text)
    if args.json:
        write_json(args.json, report)
    return 0


MAX_CONVERT_BYTES = 1 << 28
"""The largest sample cache ``--convert`` makes (256 MiB): each flag is bounded on its own,
and this bounds their product, checked before anything is allocated (the round trip
holds the cache three times)."""


def _tensors_of(cache: object) -> tuple[Any, ...]:
    return cache if isinstance(cache, tuple) else (cache,)


def convert_report(args: argparse.Namespace) -> dict[str, Any]:
    """Convert a random cache from A to B and back; what moved and whether it is bit-exact."""
    import torch

    from kvspec.memory.cache_layout import CacheShape, convert, empty_cache, field_views, get_layout
    from kvspec.tensors.dtypes import bit_equal

    source, target = (get_layout(name) for name in args.convert)
    dtype = args.dtype or (source.dtypes[0] if source.dtypes else "bfloat16")
    kv = source.kv_tensors or target.kv_tensors or 2
    head_dim = source.fixed_head_dim or args.head_dim or source.head_dim_multiple or 8
    default_block = source.fixed_block_size or 16  # whole 4-token groups [LAYOUT-8]
    block_size = (args.block_size or default_block) if source.paged else 1
    blocks = args.blocks if source.paged else args.blocks * (args.block_size or default_block)
    shape = CacheShape(
        kv,
        blocks,
        block_size,
        1 if kv == 1 else args.heads or 2,
        head_dim,
        args.layers if source.cross_layer else 1,
    )
    planned = empty_cache(source, shape, dtype, device="meta")  # sizes only, nothing allocated
    need = sum(t.numel() * t.element_size() for t in _tensors_of(planned))
    if need > MAX_CONVERT_BYTES:
        raise ValueError(
            f"the sample cache --convert would make is {need:,} bytes ({shape.num_blocks} blocks "
            f"of {shape.block_size}, {shape.heads} heads, head_dim {shape.head_dim}, "
            f"{shape.layers} layer(s), {dtype}); it converts at most {MAX_CONVERT_BYTES:,}: "
            "lower --blocks, --block-size, --heads, --head-dim or --layers"
        )
    cache = empty_cache(source, shape, dtype)
    tensors = _tensors_of(cache)
    generator = torch.Generator().manual_seed(0)
    for tensor in tensors:
        raw = tensor.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=generator, dtype=torch.uint8))
    page = source.page_size(block_size)
    to_block = args.to_block_size or (block_size if target.paged else 1)
    out = convert(cache, source, target, block_size=to_block, source_block_size=page)
    back = convert(
        out,
        target,
        source,
        block_size=block_size,
        source_block_size=target.page_size(to_block),
    )
    want = field_views(cache, source, block_size=page)
    got = field_views(back, source, block_size=page)
    exact = all(bit_equal(got[n].contiguous(), want[n].contiguous()) for n in want)
    outs = out if isinstance(out, tuple) else (out,)
    return {
        "source": source.name,
        "target": target.name,
        "dtype": dtype,
        "shape": {
            "kv": shape.kv,
            "num_blocks": shape.num_blocks,
            "block_size": shape.block_size,
            "heads": shape.heads,
            "head_dim": shape.head_dim,
            "layers": shape.layers,
        },
        "target_block_size": to_block,
        "fields": [
            {"field": n, "dtype": d, "width": w}
            for n, d, w in source.information(dtype, head_dim, kv)
        ],
        "source_tensors": [list(t.shape) for t in tensors],
        "target_tensors": [list(t.shape) for t in outs],
        "bytes": sum(t.numel() * t.element_size() for t in tensors),
        "round_trip_bit_exact": exact,
    }


def render_convert(report: dict[str, Any]) -> str:
    s = report["shape"]
    fields = ", ".join(f"{f['field']} ({f['width']} x {f['dtype']})" for f in report["fields"])
    return "\n".join(
        [
            f"convert {report['source']} -> {report['target']}  ({report['dtype']}, "
            f"{s['num_blocks']} blocks of {s['block_size']} -> blocks of "
            f"{report['target_block_size']}, {s['heads']} heads, head_dim {s['head_dim']})",
            f"  every cell holds  {fields}: the same in both, so slot s of each field "
            "moves to slot s",
            f"  source tensors    {report['source_tensors']}",
            f"  target tensors    {report['target_tensors']}",
            f"  checked           {report['bytes']} random bytes converted and back: "
            + ("bit-identical" if report["round_trip_bit_exact"] else "DIFFERENT"),
        ]
    )
