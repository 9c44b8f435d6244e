"""What a one-sided run (``--transport nixl|mooncake``, :mod:`sim.paths.onesided`) is refused
for before anything starts, and whether its engine loads here."""

from __future__ import annotations

import importlib
import importlib.util
import os

from sim.net import messages
from sim.run.config import UNAUTHENTICATED, SimConfig

FAULTS = {"write": ("drop", "dup", "garbage"), "pull": ()}
"""Wire faults that mean something for a one-sided transfer, per ``--transfer``."""


def check_onesided(config: SimConfig, module: str, install: str) -> None:
    """Refuse a one-sided run that makes no sense, naming the values; and one whose
    library (``module``) is not installed, naming how to install it (``install``)."""
    transport, transfer = config.transport, config.transfer
    if transfer not in ("pull", "write"):
        raise ValueError(
            f"--transport {transport} with --transfer {transfer}: it moves descriptor lists "
            "one-sided; use --transfer pull or --transfer write"
        )
    if config.ranks_per_process != 1:
        raise ValueError(
            f"--transport {transport} with --ranks-per-process {config.ranks_per_process}: "
            "each rank process owns one engine; use --ranks-per-process 1"
        )
    if config.device != "cpu":
        raise ValueError(
            f"--transport {transport} with --device {config.device}: the sim registers "
            "DRAM; use --device cpu"
        )
    if len(config.stages) != 2:
        raise ValueError(
            f"--transport {transport} with {len(config.stages)} stages: a middle stage's KV "
            "would be read before it is verified; use two stages"
        )
    if config.stream_groups:
        raise ValueError(f"--transport {transport} with --stream {config.stream}: use --stream off")
    if transport in UNAUTHENTICATED:
        check_unauthenticated(config)
    if not _loopback(config.host):
        raise ValueError(
            f"--transport {transport} with --host {config.host}: its engine is held to "
            f"loopback; use --host 127.0.0.1 ({transport} across hosts is not built)"
        )
    f = config.faults
    on = {
        "drop": f.drop,
        "dup": f.dup,
        "garbage": f.garbage,
        "corrupt": f.corrupt,
        "reorder": f.reorder,
    }
    refused = sorted(k for k, p in on.items() if p and k not in FAULTS[transfer])
    if refused:
        allowed = "".join(f"{k}=P, " for k in FAULTS[transfer])
        raise ValueError(
            f"--transport {transport} --transfer {transfer} with {', '.join(refused)}: a "
            f"one-sided {transfer} has no message to strike that way; it takes "
            f"{allowed}delay=T, kill=R and hang=R"
        )
    why = unloadable(module)
    if why is not None:
        raise ValueError(f"--transport {transport} needs {module}, which {why}: {install}")


def check_unauthenticated(config: SimConfig) -> None:
    """Refuse a run over an engine of :data:`UNAUTHENTICATED`: always under
    ``--require-loopback`` (it names the interface), otherwise unless the user allowed it."""
    why = UNAUTHENTICATED[config.transport]
    if config.require_loopback:
        raise ValueError(
            f"--require-loopback with --transport {config.transport}: {why}; the sim cannot "
            "hold it to 127.0.0.1. Use --transport nixl (its peers need the metadata the run "
            "sends over its authenticated connections)"
        )
    if not config.allow_unauthenticated_transport:
        raise ValueError(
            f"--transport {config.transport}: {why}. Pass --allow-unauthenticated-transport "
            "to run it anyway on a host only you use (the report then says so first), or use "
            "--transport nixl"
        )


def quiet_engines() -> None:
    """Before an engine loads: NIXL's Python log says on stdout what the sim reports its
    own way, and Mooncake's C++ log (glog, on stderr) a dozen INFO and WARNING lines per
    rank (its own ``MC_LOG_LEVEL`` holds it to errors); a value already set is kept."""
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")


def unloadable(module: str) -> str | None:
    """Why ``module`` cannot be imported here (not installed, or a library it loads is
    missing), or None."""
    quiet_engines()
    try:
        if importlib.util.find_spec(module) is None:
            return "is not installed"
    except ModuleNotFoundError:  # its package is absent
        return "is not installed"
    try:
        importlib.import_module(module)
    except (ImportError, OSError) as error:
        return f"does not load ({messages.short(str(error))})"
    return None


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
