"""Validating a simulated run before anything starts: plans, layouts, ports, the host,
sizes and memory, every rule from :mod:`kvspec` (:func:`validate`), and what a run's
ports expose (:func:`exposure`)."""

from __future__ import annotations

import ipaddress
import math
import socket
from collections.abc import Sequence

from kvspec.console.args import some_of
from kvspec.memory.cache_layout import (
    PRESETS,
    CacheLayout,
    CacheShape,
    empty_cache,
    holds_attention,
    layouts_for,
)
from kvspec.memory.planes import check_scaled, smallest_block
from kvspec.memory.records import check_holds
from kvspec.topology.model import ModelShape
from sim.net import messages
from sim.net.endpoints import all_ranks, check_ports
from sim.net.p2p import check_transport
from sim.net.sizing import check_fits
from sim.run.config import ONE_SIDED, ONE_SIDED_LIBRARIES, UNAUTHENTICATED, SimConfig
from sim.run.workload import Request, Workload


def validate(config: SimConfig, *, processes_here: int | None = None) -> None:
    """Refuse a run the spec refuses, before any process starts [PLAN-1, PORT-3, LAYOUT-1];
    and a transport this machine cannot run, for ``processes_here`` rank processes
    (by default, every rank of the run on this host)."""
    workload = Workload(config, 0)  # every group's requests have the same lengths
    if config.content == "groups":  # a hybrid's regions are its groups', not a paged cache's
        _check_group_plans(workload)
    else:
        check_layouts(config)  # first: a record cache's plans are by its rows [LAYOUT-7]
        # Requests go round the DP groups by index, so the first prod(dp) of them meet every
        # pairing of groups [DP-1]: the plans of those, before anything costs O(requests).
        _check_plans(workload, workload.first(math.prod(s.dp for s in config.stages)))
    for stage, layout in enumerate(config.stages):  # the rules fit the caches [CP-2]
        name = "--src-block-size" if stage == 0 else "--dst-block-size"
        try:
            layout.check_block_size(config.layout_of(stage)[1])
        except ValueError as error:
            raise ValueError(f"stage {stage} ({layout.describe()}), {name}: {error}") from None
    for name, size in (
        ("--src-block-size", config.src_block_size),
        ("--dst-block-size", config.dst_block_size),
    ):
        if size < 1:
            raise ValueError(f"{name} must be >= 1, got {size}")
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "--device cuda, but torch.cuda.is_available() is False on this machine"
            )
    if config.transport in ONE_SIDED:
        from sim.paths.onesided_checks import check_onesided

        module, install = ONE_SIDED_LIBRARIES[config.transport]
        check_onesided(config, module, install)
    if config.p2p:
        ranks = len(all_ranks(config))
        check_transport(config, processes_here or -(-ranks // config.ranks_per_process))
    if config.transport != "inproc":
        check_host(config.host)
        exposed = exposure(config) if config.require_loopback else None
        if exposed:
            raise ValueError(f"--require-loopback with --host {config.host}: {exposed}")
        if config.ports == "spec":
            check_ports(config)
    check_fits(config)  # O(ranks): before the one check that is O(requests)
    if any(layout.token_shards > 1 for layout in config.stages):
        _check_plans(workload, workload.requests)  # one plan per request length [PLAN-6]


def _check_group_plans(workload: Workload) -> None:
    """A hybrid's group plan of every request length, refused as the spec refuses it: a
    layout that cannot hold a group's heads or state units [GROUP-3], or a receiver that
    would need window or chunk tokens its sender has evicted [WINDOW-2], naming the request."""
    for stage in range(workload.config.last_stage):
        plans, seen = workload.plans(stage), set()
        for request in workload.requests:
            if request.seq_len in seen:
                continue
            seen.add(request.seq_len)
            try:
                plans.groups_of(request)
            except ValueError as error:
                raise ValueError(
                    f"{request.request_id} ({request.seq_len} tokens): {error}"
                ) from None


def _check_plans(workload: Workload, requests: Sequence[Request]) -> None:
    """Make the plan that moves each of ``requests`` out of every stage; each is made once
    per key (length where tokens are split, DP groups) and refused as the spec refuses it."""
    for stage in range(workload.config.last_stage):
        plans = workload.plans(stage)
        for request in requests:
            plans.of(request)


def check_layouts(config: SimConfig) -> None:
    """Refuse cache layouts that cannot hold the model, or a pair whose cells hold other
    information, naming the presets each can be paired with [LAYOUT-1, LAYOUT-6, ORACLE-6]."""
    model = config.model
    held = layouts_for(model.attention, cross_layer=True)
    for flag, spec in (("--src-layout", config.src_layout), ("--dst-layout", config.dst_layout)):
        name = spec.ref
        if spec.plain and not holds_attention(spec, model.attention, cross_layer=True):
            holds = {2: "K and V", 1: "one latent"}.get(spec.kv_tensors or 0, "K and V or a latent")
            raise ValueError(
                f"cache layout {name!r} cannot hold an {model.attention} cache: its "
                f"kv_tensors is {spec.kv_tensors} ({holds}); use one of {some_of(held)} "
                "[LAYOUT-1]"
            )
        why = _cannot_hold(spec, model)
        if why is not None:
            raise ValueError(
                f"{flag} {name} cannot hold {model.describe()}: {why}; the presets that can "
                f"are: {some_of([h.name for h in _holding(config)]) or 'none'}"
            )
        if spec.scaled:  # its blocks: whole groups of a split slot axis, a fixed page size
            block = config.src_block_size if flag == "--src-layout" else config.dst_block_size
            side = "--src-block-size" if flag == "--src-layout" else "--dst-block-size"
            try:
                check_scaled(spec, model.dtype, block, model.head_dim)
            except ValueError as error:
                raise ValueError(f"{flag} {name} with {side} {block}: {error}") from None
    src, dst = config.src_layout, config.dst_layout
    if _information(config, src) != _information(config, dst):
        raise ValueError(
            f"cache layouts {src.ref} -> {dst.ref} do not hold the same information for "
            f"{model.describe()}: a {src.ref} cell holds {_fields(config, src)}, a {dst.ref} "
            f"cell {_fields(config, dst)}; nothing is dropped or made up. {src.ref} pairs with "
            f"{some_of(_pairable(config, src))}; {dst.ref} pairs with "
            f"{some_of(_pairable(config, dst))} [LAYOUT-6]"
        )


def _information(config: SimConfig, layout: CacheLayout) -> tuple[tuple[str, str, int | str], ...]:
    model = config.model
    return layout.information(model.dtype, model.head_dim, model.kv_tensors)


def _fields(config: SimConfig, layout: CacheLayout) -> str:
    return ", ".join(f"{f} ({w} x {d})" for f, d, w in _information(config, layout))


def _cannot_hold(spec: CacheLayout, model: ModelShape) -> str | None:
    """Why ``spec`` cannot hold ``model``'s cache, or None: every rule of the layout
    (K/V count, dtype, fixed width, field alignment), nothing allocated [LAYOUT-5, ORACLE-6]."""
    base = spec.layer_layout
    block = smallest_block(base)
    try:
        check_holds(spec, model)
        empty_cache(
            base,
            CacheShape(model.kv_tensors, 1, block, 1, model.head_dim),
            model.dtype,
            "meta",
        )
    except ValueError as error:
        return str(error)
    return None


def _holding(config: SimConfig) -> list[CacheLayout]:
    """Every preset whose cells can hold the run's model [LAYOUT-5, ORACLE-6]."""
    return [spec for spec in PRESETS.values() if _cannot_hold(spec, config.model) is None]


def _pairable(config: SimConfig, layout: CacheLayout) -> list[str]:
    """The presets that hold the model with the same information as ``layout`` [LAYOUT-6]."""
    want = _information(config, layout)
    return [h.name for h in _holding(config) if _information(config, h) == want]


def check_host(host: str) -> None:
    """Refuse a ``--host`` this machine cannot bind, naming why (a typo, not ours)."""
    try:
        infos = socket.getaddrinfo(host, 0, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise ValueError(f"--host {messages.short(host)}: cannot resolve it ({error})") from None
    address = infos[0][4][0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as error:
            raise ValueError(
                f"--host {host} ({address}) is not an address of this machine: {error.strerror}"
            ) from None


def exposure(config: SimConfig) -> str | None:
    """What a run bound beyond loopback exposes, or None for a loopback run."""
    if config.transport == "inproc":
        return None
    if config.transport in UNAUTHENTICATED:  # Mooncake's engine binds every interface
        return UNAUTHENTICATED[config.transport] + "."
    address = socket.getaddrinfo(config.host, 0, socket.AF_INET)[0][4][0]
    if ipaddress.ip_address(address).is_loopback:
        return None
    where = "ports the OS assigns" if config.ports == "os" else f"ports from {config.base_port}"
    p2p = (
        f" The tensor frames go over torch.distributed ({config.transport}), which listens on "
        f"{config.host} too, on ports it picks, and authenticates no peer: keep that network "
        "to the run's hosts."
        if config.p2p
        else ""
    )
    return (
        f"senders listen on {config.host} ({address}), {where}: any host that can reach it can "
        "connect. Ranks accept only peers that prove this run's secret (HMAC-signed "
        "handshakes); the KV itself crosses unencrypted." + p2p
    )
