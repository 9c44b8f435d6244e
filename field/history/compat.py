"""What the field adapters need to run on an older engine release, supplied from outside.

The adapters in kvspec/adapters/ are written against the pinned current releases
(field/requirements/). The historical corpus (field/history/) runs them, unchanged, on
older releases; where an older release lacks a name an adapter reaches for, this module
gives the adapter what it needs *without changing a line of engine code that runs*: it only
adds a name the release does not have, and only when the release's own code never calls
it (checked by reading the release; each shim says where). A bug entry names
``field.history.compat:NAME`` as its adapter on such a release (field/history/README.md).

What each adapter would need to run these releases by itself is written beside each shim,
so the adapter can take it over and the shim go.
"""

from __future__ import annotations

from typing import Any

from kvspec.adapters.sglang import SglangAdapter


def _absent(name: str, release: str) -> Any:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{name} does not exist in {release}; field/history/compat.py added the name "
            "only so the adapter can bind it, and nothing in that release may call it"
        )

    return missing


def sglang_before_0_5_19() -> SglangAdapter:
    """The ``sglang`` adapter on SGLang releases before 0.5.19 (0.5.15, 0.5.16).

    Two names the adapter reaches for are younger than those releases:

    - ``CommonKVManager._mla_kv_entry_span_with_pp`` (common/conn.py, first in 0.5.21): the
      adapter binds it onto its stand-in manager before calling ``get_mla_kv_ptrs_with_pp``.
      In 0.5.15 and 0.5.16 ``get_mla_kv_ptrs_with_pp`` never calls it (it slices with
      ``kv_args.prefill_start_layer`` itself; the name occurs nowhere in either wheel), so
      it is added as a stub that raises if anything ever calls it. The adapter would need:
      bind it only when the class has it.
    - ``ServerArgs.resolve_once`` (server_args.py, first in 0.5.19): in 0.5.15 and 0.5.16
      ``ServerArgs.__post_init__`` runs the whole resolution when the record is built, so
      the adapter's ``ServerArgs(...)`` has already resolved and the call is added as a
      no-op; ``check_server_args`` exists in both and runs as the adapter calls it. The
      adapter would need: call ``resolve_once`` only when ``ServerArgs`` has it.
    """
    adapter = SglangAdapter()
    release = adapter.version
    manager = adapter.conn.CommonKVManager
    if not hasattr(manager, "_mla_kv_entry_span_with_pp"):
        manager._mla_kv_entry_span_with_pp = _absent(
            "CommonKVManager._mla_kv_entry_span_with_pp", release
        )
    from sglang.srt import server_args  # the engine directory is on PYTHONPATH

    if not hasattr(server_args.ServerArgs, "resolve_once"):
        server_args.ServerArgs.resolve_once = lambda self: None  # __post_init__ resolved it
    return adapter
