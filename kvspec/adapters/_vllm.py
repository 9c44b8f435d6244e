"""What the vLLM adapters share: vLLM's own start-up head checks, run on CPU, and calling
an engine function across releases whose signatures grew.

Nothing here restates a vLLM rule: the head checks are vLLM's code, called on the
attributes it reads. Several vLLM releases are checked side by side (`make field` and
the historical corpus, field/history/), so the adapters call engine functions by keyword
and pass only the keywords the installed release's function takes
(:func:`call_accepting`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kvspec.adapters._engine import import_engine


def parameters(function: Callable[..., Any]) -> frozenset[str]:
    """The keyword names ``function`` takes in the installed release."""
    return frozenset(inspect.signature(function).parameters)


def call_accepting(function: Callable[..., Any], /, **kwargs: Any) -> Any:
    """Call ``function`` with those of ``kwargs`` it takes: an older release's function
    that lacks a later parameter (vLLM's Mooncake ``_compute_sender_transfer_plan``
    before ``total_num_kv_heads``, vllm#52516) runs as that release serves."""
    names = parameters(function)
    return function(**{k: v for k, v in kwargs.items() if k in names})


def vllm_version(adapter: str, install: str) -> str:
    """``vllm X.Y.Z`` of the installed package, or a refusal with what to install."""
    vllm = import_engine("vllm", adapter=adapter, install=install)
    return f"vllm {vllm.__version__}"


@functools.lru_cache(maxsize=256)
def vllm_head_checks(
    num_kv_heads: int, tp: int, num_heads: int, *, adapter: str, install: str
) -> None:
    """vLLM's head checks at TP ``tp``: ``ModelConfig.verify_with_parallel_config`` on
    the attributes it reads (vllm/config/model.py), then ``QKVParallelLinear.__init__``
    (vllm/model_executor/layers/linear.py) on a bare instance with the TP world size
    answering ``tp``; it has passed the KV-head split once it sets
    ``num_kv_head_replicas`` (what follows allocates weights and needs a config).
    Raises what vLLM raises (``AssertionError`` from ``divide``, ``ValueError``)."""
    config_model = import_engine("vllm.config.model", adapter=adapter, install=install)
    linear = import_engine("vllm.model_executor.layers.linear", adapter=adapter, install=install)
    model = SimpleNamespace(model_arch_config=SimpleNamespace(total_num_attention_heads=num_heads))
    parallel = SimpleNamespace(
        enable_hc_sp=False,
        tensor_parallel_size=tp,
        enable_expert_parallel=False,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
    )
    # past the head check, later checks read attributes a stub does not have
    with contextlib.suppress(AttributeError):
        config_model.ModelConfig.verify_with_parallel_config(model, parallel)
    layer = linear.QKVParallelLinear.__new__(linear.QKVParallelLinear)
    real = linear.get_tensor_model_parallel_world_size
    linear.get_tensor_model_parallel_world_size = lambda: tp
    try:
        linear.QKVParallelLinear.__init__(layer, num_heads, 1, num_heads, num_kv_heads)
    except Exception:  # a divide() assert, or what needs a config after the split
        if not hasattr(layer, "num_kv_head_replicas"):
            raise
    finally:
        linear.get_tensor_model_parallel_world_size = real


def _no_op(self: object) -> None:
    """A destructor that does nothing."""


def bare_instance(cls: Any) -> Any:
    """An instance of engine class ``cls`` that ran no ``__init__`` (the caller sets the
    attributes the method it calls reads) and whose destructor does nothing: a worker
    never started has no threads or sockets for its ``__del__`` to stop."""
    bare: Any = type(f"Bare{cls.__name__}", (cls,), {"__del__": _no_op})
    return object.__new__(bare)
