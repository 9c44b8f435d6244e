"""One TP rank of a vLLM 0.33.0 instance serving with the NixlConnector, on CPU.

Run by field/workers/vllm_nixl.py (one process per rank, as vLLM's multiprocess
executor runs them), never imported by kvspec. Every step below is vLLM's own code from
the installed wheel; this module only calls it in the order serving does and reports
what happened over a control pipe (JSON lines; nothing on it is unpickled).

What serving runs, and what runs here:

- ``EngineArgs(...).create_engine_config()`` with ``VLLM_TARGET_DEVICE=cpu``
  (vLLM's ``CpuPlatform``, which the CUDA wheel ships) and ``--load-format dummy``.
- The worker: ``CPUWorker.__init__`` calls ``torch.ops._C.init_cpu_memory_env`` (NUMA
  memory binding), a kernel of vLLM's CPU build that the CUDA wheel does not have, so the
  worker object itself cannot be built here. What ``CPUWorker.init_device`` and
  ``Worker.initialize_from_config`` (vllm/v1/worker/gpu_worker.py) call is called instead,
  in their order: ``init_worker_distributed_environment`` (torch.distributed over gloo,
  vLLM's real TP group), ``CPUModelRunner(...)``, ``load_model()`` (the model's layers,
  with vLLM's attention layers and their ``CPU_ATTN`` backend), ``get_kv_cache_spec()``,
  then ``record_kv_cache_layout``, ``ensure_kv_transfer_initialized`` (builds the
  ``NixlPullConnectorWorker``) and ``CPUModelRunner.initialize_kv_cache``, which allocates
  the caches with ``allocate_kv_cache`` and registers them with NIXL
  (``register_kv_caches``). Skipped: the memory-pool contexts (CUDA sleep mode) and the
  warm-up forward (it needs vLLM's CPU kernels; an explicit ``kv_cache_memory_bytes``
  makes serving skip the profiling too).
- The engine core's KV-cache planning (vllm/v1/engine/core.py ``_initialize_kv_caches``):
  ``register_all_kvcache_specs``, ``resolve_kv_cache_layout``,
  ``get_global_kv_cache_groups``, ``get_kv_cache_configs`` and
  ``generate_scheduler_kv_cache_config``, run in every rank on every rank's (identical)
  specs: serving runs them once in the engine core and sends each worker its config.
- The scheduler connector (rank 0 only, as the engine core holds it; prefill's is built
  when it publishes the handshake, with a side-channel port the OS just handed out):
  ``KVConnectorFactory.create_connector(role=SCHEDULER)``, its handshake listener
  (``set_xfer_handshake_metadata`` with every rank's payload), and per request the calls
  vLLM's ``Scheduler`` makes: ``on_new_request``, ``get_num_new_matched_tokens``,
  ``update_state_after_alloc``, ``build_connector_meta``, ``request_finished`` and
  ``update_connector_output``. The scheduler's own bookkeeping that feeds them is set as
  it would be: the request's status and ``num_computed_tokens`` after its prefill, and
  the block ids the block pool handed out (chosen by the harness, shuffled).
- Each engine step without a forward: ``KVConnectorModelRunnerMixin.kv_connector_no_forward``
  with a ``SchedulerOutput`` carrying the step's connector metadata, exactly as
  ``GPUModelRunner.execute_model`` calls it when no tokens are scheduled. The metadata
  crosses from rank 0 to the other ranks as msgpack (serving pickles the SchedulerOutput
  into shared memory) and is rebuilt into vLLM's own ``NixlConnectorMetadata``.
- The prefill forward pass is the one thing not run: instead the oracle writes each
  request's KV into the rank's blocks, in the layer views the attention layers hold, for
  the KV heads vLLM's ``QKVParallelLinear`` gives this rank.

Recorded, not changed: the worker's ``nixl_wrapper`` is wrapped in
:class:`RecordingAgent`, which forwards every call unchanged and keeps the descriptor
lists vLLM prepares (``prep_xfer_dlist``) and the READs it posts (``make_prepped_xfer``),
so field/workers/descs.py can judge them against DESC-1..3; and its ``_log_failure``
(the one place the worker reports a failed handshake or transfer) is wrapped by
:class:`Failures` to keep each failure's type and exception before it logs them.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = {
    "VLLM_TARGET_DEVICE": "cpu",  # vLLM's CpuPlatform (vllm/platforms/__init__.py)
    "HF_HUB_OFFLINE": "1",
    "UCX_NET_DEVICES": "lo",  # NIXL's UCX backend on loopback only
    "GLOO_SOCKET_IFNAME": "lo",  # torch.distributed's gloo on loopback only
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_CONFIGURE_LOGGING": "1",
}


class Channel:
    """JSON lines over two inherited pipe descriptors (stdout stays vLLM's log)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader = os.fdopen(read_fd, "r", buffering=1)
        self.writer = os.fdopen(write_fd, "w", buffering=1)

    def send(self, **message: Any) -> None:
        self.writer.write(json.dumps(message) + "\n")
        self.writer.flush()

    def receive(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise SystemExit("the harness closed the control pipe")
        return dict(json.loads(line))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


class Failures:
    """The transfer failures the worker reports through its ``_log_failure`` (which logs
    each with its exception), kept as "type: exception at file:line (code)"; the call is
    forwarded unchanged."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def wrap(self, log_failure: Callable[..., Any]) -> Callable[..., Any]:
        def record(*args: Any, **kwargs: Any) -> Any:
            text = str(kwargs.get("failure_type", args[0] if args else "failure"))
            error = kwargs.get("error")
            if isinstance(error, BaseException):
                text += f": {type(error).__name__}"
                frames = traceback.extract_tb(error.__traceback__)
                if frames:
                    where = frames[-1]
                    text += f" at {Path(where.filename).name}:{where.lineno}"
                    text += f" ({where.line})" if where.line else ""
            if text not in self.seen:
                self.seen.append(text)
            return log_failure(*args, **kwargs)

        return record


FAILURES = Failures()


class RecordingAgent:
    """The NIXL agent, every call forwarded unchanged; the descriptor lists vLLM prepares
    and the READs it posts are kept (instrumentation only: serving calls the same agent
    with the same arguments)."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self.dlists: dict[int, dict[str, Any]] = {}
        self.reads: list[dict[str, Any]] = []
        self._handles: dict[int, tuple[int, Any]] = {}  # id(handle) -> (key, handle)
        self.registered: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent, name)

    def register_memory(self, descs: Any, *args: Any, **kwargs: Any) -> Any:
        import numpy as np

        rows = np.asarray(descs) if not hasattr(descs, "descCount") else None
        if rows is not None:
            self.registered.extend([int(v) for v in row[:2]] for row in rows.reshape(len(rows), -1))
        return self._agent.register_memory(descs, *args, **kwargs)

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, *args: Any, **kwargs: Any) -> Any:
        import numpy as np

        rows = np.asarray(xfer_list, dtype=np.uint64)
        handle = self._agent.prep_xfer_dlist(agent_name, xfer_list, *args, **kwargs)
        key = len(self._handles)
        self._handles[id(handle)] = (key, handle)  # held, so its id is never reused
        self.dlists[key] = {
            "agent": str(agent_name),
            "rows": rows.tolist(),
        }
        return handle

    def make_prepped_xfer(
        self,
        op: str,
        local_handle: Any,
        local_ids: Any,
        remote_handle: Any,
        remote_ids: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        import numpy as np

        self.reads.append(
            {
                "op": op,
                "local": self._handles[id(local_handle)][0],
                "local_ids": np.asarray(local_ids).astype(np.int64).tolist(),
                "remote": self._handles[id(remote_handle)][0],
                "remote_ids": np.asarray(remote_ids).astype(np.int64).tolist(),
                "notif": bytes(kwargs.get("notif_msg", b"")).decode(errors="replace"),
            }
        )
        return self._agent.make_prepped_xfer(
            op, local_handle, local_ids, remote_handle, remote_ids, *args, **kwargs
        )


def free_port() -> int:
    """A port the OS just handed out on loopback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_model_dir(path: str, spec: dict[str, Any]) -> None:
    """A Llama-architecture config.json (weights: ``--load-format dummy``)."""
    heads = spec["attention_heads"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": heads * spec["head_dim"],
        "intermediate_size": 2 * heads * spec["head_dim"],
        "num_attention_heads": heads,
        "num_key_value_heads": spec["kv_heads"],
        "head_dim": spec["head_dim"],
        "num_hidden_layers": spec["layers"],
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "torch_dtype": spec["dtype"],
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
    }
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


class Rank:
    """One TP rank: its worker, its caches and (rank 0) its instance's scheduler connector."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.side = job["side"]  # "prefill" or "decode"
        self.rank = job["rank"]
        self.tp = job["tp"]
        self.requests: dict[str, Any] = {}

    # -- start-up, as CPUWorker.init_device and Worker.initialize_from_config -----------
    def start(self) -> dict[str, Any]:
        import torch
        from vllm.config import KVTransferConfig, set_current_vllm_config
        from vllm.engine.arg_utils import EngineArgs

        job = self.job
        args = EngineArgs(
            model=job["model_dir"],
            skip_tokenizer_init=True,
            load_format="dummy",
            dtype=job["model"]["dtype"],
            tensor_parallel_size=self.tp,
            block_size=job["block_size"],
            enforce_eager=True,
            kv_cache_memory_bytes=job["kv_cache_bytes"],
            max_model_len=job["max_model_len"],
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector",
                kv_role="kv_producer" if self.side == "prefill" else "kv_consumer",
                kv_buffer_device="cpu",
                engine_id=job["engine_id"],
            ),
        )
        self.vllm_config = config = args.create_engine_config()
        with set_current_vllm_config(config):
            self._start(config, torch)
        return self.report_registration()

    def _start(self, config: Any, torch: Any) -> None:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.distributed.kv_transfer.kv_transfer_state import (
            ensure_kv_transfer_initialized,
            get_kv_transfer_group,
        )
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            record_kv_cache_layout,
            resolve_kv_cache_layout,
        )
        from vllm.v1.core.kv_cache_planning import (
            get_global_kv_cache_groups,
            get_kv_cache_configs,
        )
        from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

        job = self.job
        init_worker_distributed_environment(config, self.rank, job["dist_init"], self.rank, "gloo")
        self.runner = runner = CPUModelRunner(config, torch.device("cpu"))
        runner.load_model()
        specs = runner.get_kv_cache_spec()

        # The engine core's planning, on every rank's specs (all ranks' are equal).
        register_all_kvcache_specs(config)
        supported = [
            layout.name
            for layout in get_supported_kv_cache_layouts(get_current_attn_backends(config))
        ]
        all_specs = [specs] * self.tp
        resolve_kv_cache_layout(config, [supported] * self.tp, list(specs.values()))
        groups = get_global_kv_cache_groups(config, all_specs)
        config.adjust_dcp_kv_cache_interleave_size(groups)
        configs = get_kv_cache_configs(config, all_specs, [job["kv_cache_bytes"]] * self.tp, groups)
        for c in configs:
            c.kv_cache_layout = config.cache_config.kv_cache_layout
        kv_cache_config = configs[self.rank]
        self.scheduler_kv_cache_config = generate_scheduler_kv_cache_config(configs)

        # Worker.initialize_from_config.
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        if kv_cache_config.kv_cache_layout is not None:
            record_kv_cache_layout(config.cache_config, kv_cache_config.kv_cache_layout)
        config.cache_config.hash_block_size = kv_cache_config.hash_block_size
        config.cache_config.cache_hit_alignment_tokens = kv_cache_config.cache_hit_alignment_tokens
        ensure_kv_transfer_initialized(config, kv_cache_config)
        self.connector = get_kv_transfer_group()
        worker = self.connector.connector_worker
        self.agent = RecordingAgent(worker.nixl_wrapper)
        worker.nixl_wrapper = self.agent
        worker._log_failure = FAILURES.wrap(worker._log_failure)
        runner.initialize_kv_cache(kv_cache_config)
        self.worker = worker
        self.kv_cache_config = kv_cache_config
        self.layer_names = sorted(
            (n for g in kv_cache_config.kv_cache_groups for n in g.layer_names),
            key=_layer_index,
        )

        if self.rank == 0 and self.side == "decode":
            self.make_scheduler()

    def make_scheduler(self) -> None:
        """The instance's scheduler connector, as the engine core's Scheduler builds it."""
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        with set_current_vllm_config(self.vllm_config):
            self.scheduler = KVConnectorFactory.create_connector(
                config=self.vllm_config,
                role=KVConnectorRole.SCHEDULER,
                kv_cache_config=self.scheduler_kv_cache_config,
            ).connector_scheduler

    # -- what the rank holds ----------------------------------------------------------
    def layer_caches(self) -> list[Any]:
        """Each layer's cache as its attention layer holds it (bound by bind_kv_cache)."""
        context = self.vllm_config.compilation_config.static_forward_context
        return [context[name].kv_cache for name in self.layer_names]

    def kv_heads(self) -> list[int]:
        """The global KV heads of this rank, from vLLM's QKVParallelLinear of layer 0:
        shard ``tp_rank // num_kv_head_replicas`` of ``num_kv_heads`` heads."""
        qkv = self.runner.model.model.layers[0].self_attn.qkv_proj
        shard = qkv.tp_rank // qkv.num_kv_head_replicas
        return list(range(shard * qkv.num_kv_heads, (shard + 1) * qkv.num_kv_heads))

    def report_registration(self) -> dict[str, Any]:
        caches = self.layer_caches()
        registered = self.worker.kv_caches_base_addr[self.worker.engine_id][self.rank]
        views = [int(t.data_ptr()) for t in caches]
        payload = self.connector.get_handshake_metadata()
        import msgspec

        return {
            "handshake": b64(msgspec.msgpack.encode(payload)),
            "layout": self.worker.kv_cache_layout,
            "backend": self.worker.backend_name,
            "block_size": self.worker.block_size,
            "num_blocks": int(caches[0].shape[0]),
            "shape": list(caches[0].shape),
            "strides": list(caches[0].stride()),
            "dtype": str(caches[0].dtype).removeprefix("torch."),
            "layer_names": self.layer_names,
            "layer_addresses": views,
            "layer_bytes": [int(t.numel() * t.element_size()) for t in caches],
            "registered_addresses": [int(a) for a in registered],
            "block_len": [int(b) for b in self.worker.block_len_per_layer],
            "heads": self.kv_heads(),
            "tp_rank": int(self.worker.tp_rank),
        }

    # -- the oracle's prefill ---------------------------------------------------------
    def paged(self) -> Any:
        from kvspec.memory.cache_layout import get_layout
        from kvspec.memory.paged import PagedCache

        layout = get_layout(self.job["kvspec_layout"])  # the job file names it
        return PagedCache(layout, tuple(self.layer_caches()), block_size=self.worker.block_size)

    def model_shape(self) -> Any:
        from kvspec.topology.model import ModelShape

        m = self.job["model"]
        return ModelShape(m["layers"], m["kv_heads"], m["head_dim"], dtype=m["dtype"])

    def fill(self) -> dict[str, Any]:
        """Write each request's oracle KV into its blocks (the prefill forward's place),
        and the slots past its last token with the oracle of ``<id>~pad``, so a read that
        copies whole blocks shows where those bytes land."""
        from kvspec.memory.paged import scatter_request
        from kvspec.tensors.oracle import oracle_kv

        cache, model, heads = self.paged(), self.model_shape(), self.kv_heads()
        block = self.worker.block_size
        for request in self.job["requests"]:
            ids, seq_len = request["prefill_blocks"], request["seq_len"]
            kv = oracle_kv(
                model,
                request["id"],
                tokens=seq_len,
                heads=range(heads[0], heads[-1] + 1),
                seed=self.job["seed"],
            )
            scatter_request(kv, cache, ids)
            pad = len(ids) * block - seq_len
            if pad:
                padding = oracle_kv(
                    model,
                    request["id"] + "~pad",
                    tokens=range(seq_len, seq_len + pad),
                    heads=range(heads[0], heads[-1] + 1),
                    seed=self.job["seed"],
                )
                _scatter_tail(padding, cache, ids[-1], block - pad)
        return {"filled": [r["id"] for r in self.job["requests"]]}

    # -- the scheduler connector (rank 0) ----------------------------------------------
    def serve_handshake(self, payloads: dict[str, str]) -> dict[str, Any]:
        import msgspec
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
            NixlHandshakePayload,
        )

        decoded = {
            (0, int(rank)): msgspec.msgpack.decode(unb64(data), type=NixlHandshakePayload)
            for rank, data in payloads.items()
        }
        # The listener binds VLLM_NIXL_SIDE_CHANNEL_PORT (read when the scheduler connector
        # is built): a port the OS just handed out, taken at once. A port someone else
        # took in between kills vLLM's listener thread before it signals ready, and
        # set_xfer_handshake_metadata then waits forever: the harness's deadline ends it.
        os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
        self.make_scheduler()
        self.scheduler.set_xfer_handshake_metadata(decoded)
        return {"host": self.scheduler.side_channel_host, "port": self.scheduler.side_channel_port}

    def make_request(self, spec: dict[str, Any], params: dict[str, Any]) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        request = Request(
            request_id=spec["id"],
            prompt_token_ids=[1 + (i % 1000) for i in range(spec["seq_len"])],
            sampling_params=SamplingParams(max_tokens=16),
            pooling_params=None,
        )
        request.kv_transfer_params = params
        return request

    def blocks(self, ids: list[int]) -> Any:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        return KVCacheBlocks((tuple(KVCacheBlock(i) for i in ids),))

    def admit(self, params: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """vLLM's Scheduler admitting each request: on_new_request, then the matched
        tokens and the allocation's update; returns what the connector said."""
        out = {}
        for spec in self.job["requests"]:
            request = self.make_request(spec, dict(params[spec["id"]]))
            self.requests[spec["id"]] = request
            self.scheduler.on_new_request(request)
            matched, is_async = self.scheduler.get_num_new_matched_tokens(request, 0)
            ids = spec["prefill_blocks" if self.side == "prefill" else "decode_blocks"]
            self.scheduler.update_state_after_alloc(request, self.blocks(ids), matched)
            out[spec["id"]] = {"matched": matched, "async": is_async}
        return out

    def finish(self) -> dict[str, Any]:
        """Prefill: each request ran its prefill and stopped (max_tokens=1 after
        ``_truncate_request_for_prefill``); request_finished returns the
        kv_transfer_params the proxy hands to decode."""
        from vllm.v1.request import RequestStatus

        out = {}
        for spec in self.job["requests"]:
            request = self.requests[spec["id"]]
            request.num_computed_tokens = spec["seq_len"]
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            delay, params = self.scheduler.request_finished(
                request, (list(spec["prefill_blocks"]),)
            )
            out[spec["id"]] = {"delay_free_blocks": delay, "params": params}
        return out

    def build_meta(self) -> str:
        from vllm.v1.core.sched.output import SchedulerOutput

        return encode_meta(self.scheduler.build_connector_meta(SchedulerOutput.make_empty()))

    def update_output(self, finished_recving: list[str], finished_sending: list[str]) -> None:
        from vllm.v1.outputs import KVConnectorOutput

        self.scheduler.update_connector_output(
            KVConnectorOutput(
                finished_sending=set(finished_sending), finished_recving=set(finished_recving)
            )
        )

    # -- an engine step without a forward ---------------------------------------------
    def step(self, meta: str) -> dict[str, Any]:
        from vllm.v1.core.sched.output import SchedulerOutput
        from vllm.v1.worker.kv_connector_model_runner_mixin import (
            KVConnectorModelRunnerMixin,
        )

        output = SchedulerOutput.make_empty()
        output.kv_connector_metadata = decode_meta(meta)
        result = KVConnectorModelRunnerMixin.kv_connector_no_forward(output, self.vllm_config)
        kv = result.kv_connector_output
        return {
            "finished_sending": sorted(kv.finished_sending or ()) if kv else [],
            "finished_recving": sorted(kv.finished_recving or ()) if kv else [],
            "failed_recving": sorted(getattr(kv, "failed_recving", None) or ()) if kv else [],
            "invalid_block_ids": sorted(kv.invalid_block_ids or ()) if kv else [],
        }

    # -- the decode side's verdict ------------------------------------------------------
    def verify(self) -> dict[str, Any]:
        """Every element of this rank's cache: each request's tokens against the oracle,
        the slots past its last token, and every block no request holds (still zero)."""
        import torch

        from kvspec.memory.paged import gather_request
        from kvspec.tensors.oracle import oracle_kv, verify

        cache, model, heads = self.paged(), self.model_shape(), self.kv_heads()
        block = self.worker.block_size
        head_range = range(heads[0], heads[-1] + 1)
        results = []
        used: set[int] = set()
        for request in self.job["requests"]:
            ids, seq_len = request["decode_blocks"], request["seq_len"]
            used.update(ids)
            stored = gather_request(cache, ids, seq_len)
            verdict = verify(
                stored,
                model,
                request["id"],
                tokens=seq_len,
                heads=head_range,
                seed=self.job["seed"],
            )
            pad = len(ids) * block - seq_len
            tail = "none"
            if pad:
                got = _gather_tail(cache, ids[-1], block - pad)
                padding = oracle_kv(
                    model,
                    request["id"] + "~pad",
                    tokens=range(seq_len, seq_len + pad),
                    heads=head_range,
                    seed=self.job["seed"],
                ).data
                if torch.equal(got.view(torch.int16), torch.zeros_like(got).view(torch.int16)):
                    tail = "untouched"
                elif torch.equal(got.view(torch.int16), padding.view(torch.int16)):
                    tail = "prefill's slots past the range"
                else:
                    tail = "other bytes"
            results.append(
                {
                    "id": request["id"],
                    "ok": verdict.ok,
                    "untouched": bool((stored.data.view(torch.int16) == 0).all()),
                    "elements": verdict.total,
                    "mismatches": verdict.mismatches,
                    "message": verdict.message,
                    "bytes": int(stored.data.numel() * stored.data.element_size()),
                    "tail_slots": pad,
                    "tail": tail,
                }
            )
        stray = 0
        for layer in self.layer_caches():
            others = [b for b in range(layer.shape[0]) if b not in used]
            stray += int((layer[others].view(torch.int16) != 0).sum())
        return {
            "requests": results,
            "connector_errors": FAILURES.seen,
            "stray_nonzero_elements": stray,
            "reads": self.agent.reads,
            "dlists": {str(k): v for k, v in self.agent.dlists.items()},
        }

    def shutdown(self) -> None:
        self.connector.shutdown()
        if self.rank == 0:
            self.scheduler.shutdown()


def _layer_index(name: str) -> tuple[int, str]:
    digits = "".join(c if c.isdigit() else " " for c in name).split()
    return (int(digits[0]) if digits else -1, name)


def _scatter_tail(kv: Any, cache: Any, block_id: int, first_slot: int) -> None:
    """Write ``kv`` (token-major) into slots ``first_slot..`` of block ``block_id``."""
    for layer, layer_cache in enumerate(cache.layers):
        for k, view in enumerate(cache.views(layer_cache)):
            view[block_id, first_slot:] = kv.data[layer, k]


def _gather_tail(cache: Any, block_id: int, first_slot: int) -> Any:
    import torch

    return torch.stack(
        [
            torch.stack([view[block_id, first_slot:] for view in cache.views(layer)])
            for layer in cache.layers
        ]
    )


META_FIELDS = (
    "reqs_to_recv",
    "reqs_to_save",
    "reqs_to_send",
    "scheduler_clock",
    "reqs_in_batch",
    "reqs_not_processed",
    "heartbeat_by_engine",
    "push_registrations",
    "push_finished_blocks",
)


def encode_meta(meta: Any) -> str:
    """vLLM's NixlConnectorMetadata as msgpack: every field it has, and no other."""
    import msgspec

    fields = vars(meta)
    if set(fields) != set(META_FIELDS):
        raise RuntimeError(
            f"NixlConnectorMetadata has fields {sorted(fields)}; the harness knows "
            f"{sorted(META_FIELDS)} (a vLLM change: update field/workers)"
        )
    return b64(msgspec.msgpack.encode(fields))


def decode_meta(text: str) -> Any:
    """The metadata back as vLLM's own classes: ``ReqMeta``/``RemoteMeta`` built field by
    field (their ``BlockIds`` are tuples of per-group lists), the rest by msgspec."""
    import msgspec
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        HeartbeatInfo,
        NixlConnectorMetadata,
        ReqMeta,
    )

    raw = msgspec.msgpack.decode(unb64(text))
    types: dict[str, Any] = {
        "reqs_to_send": dict[str, float],
        "scheduler_clock": float,
        "reqs_in_batch": set[str],
        "reqs_not_processed": set[str],
        "heartbeat_by_engine": dict[str, HeartbeatInfo],
        "push_registrations": dict[str, dict[str, Any]],
    }
    meta = NixlConnectorMetadata()
    for name, kind in types.items():
        setattr(meta, name, msgspec.convert(raw[name], type=kind))
    meta.reqs_to_recv = {k: _req_meta(ReqMeta, v) for k, v in raw["reqs_to_recv"].items()}
    meta.reqs_to_save = {k: _req_meta(ReqMeta, v) for k, v in raw["reqs_to_save"].items()}
    meta.push_finished_blocks = {k: _block_ids(v) for k, v in raw["push_finished_blocks"].items()}
    return meta


BLOCK_ID_FIELDS = (
    "local_block_ids",
    "local_physical_block_ids",
    "region_blocks_to_zero",
    "block_ids",
)


def _block_ids(value: Any) -> Any:
    return None if value is None else tuple(list(group) for group in value)


def _req_meta(cls: Any, raw: dict[str, Any]) -> Any:
    """A ReqMeta (or its RemoteMeta) from its msgpack fields; an unknown field is refused."""
    import dataclasses

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import RemoteMeta

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - names
    if unknown:
        raise RuntimeError(f"{cls.__name__} has no fields {sorted(unknown)} (a vLLM change)")
    kwargs = {}
    for name, value in raw.items():
        if name in BLOCK_ID_FIELDS:
            value = _block_ids(value)
        elif name == "remote" and value is not None:
            value = _req_meta(RemoteMeta, value)
        elif name == "local_num_computed_blocks":
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def main() -> None:
    job = json.loads(sys.argv[1])
    channel = Channel(int(sys.argv[2]), int(sys.argv[3]))
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    rank = Rank(job)
    try:
        started = time.perf_counter()
        info = rank.start()
        if job["side"] == "prefill":
            info.update(rank.fill())
        info["start_s"] = round(time.perf_counter() - started, 1)
        channel.send(event="ready", result=info)
        while True:
            command = channel.receive()
            name = command.pop("cmd")
            if name == "exit":
                rank.shutdown()
                channel.send(event="bye", result=None)
                break
            handlers: dict[str, Callable[..., Any]] = {
                "serve": rank.serve_handshake,
                "admit": rank.admit,
                "finish": rank.finish,
                "build_meta": lambda: {"meta": rank.build_meta()},
                "update_output": rank.update_output,
                "step": rank.step,
                "verify": rank.verify,
            }
            result = handlers[name](**command)
            channel.send(event=name, result=result)
    except BaseException as error:  # the harness gets the traceback, then the exit
        channel.send(event="error", error=repr(error), traceback=traceback.format_exc())
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    # UCX's libraries crash in their exit handlers (rtnl_tc_unregister); the run is done.
    os._exit(0)


if __name__ == "__main__":
    main()
