"""``--transport gloo`` / ``--transport nccl``: the payload's tensor frames over
torch.distributed point-to-point send/recv, everything else over the ZMQ sockets.

The seam is one message wide, below the faults and above the sockets. A message of
one frame (a hello, a welcome, a notice, an end-of-stream, garbage) travels on ZMQ as
it is. A message of several frames ``[envelope, header, *tensor frames]`` travels as
``[envelope, header, manifest]`` on ZMQ, where the manifest is a small JSON object
listing the byte length of every frame that follows, and those frames travel as uint8
tensors over torch.distributed, one ``send``/``recv`` each, on a tag of their own per
(source rank, target rank) pair. So the receiver rebuilds the very frames the sender
put on the wire (corrupted ones included: faults act above the seam) and verifies every
element as over ZMQ; the bytes on the data path are the same for every transport.
Between two sim ranks in one process a message travels whole over ZMQ (a process
group does not send to itself).

Control over ZMQ and tensors over the collective library is how vLLM's
P2pNcclConnector is built: its P2pNcclEngine sends each tensor's id, dtype and shape
as a msgpack message on a ZMQ socket and the tensor over a two-rank NCCL communicator
(vllm-project/vllm, vllm/distributed/kv_transfer/kv_connector/v1/p2p/p2p_nccl_engine.py,
``send_tensor``/``recv_tensor``/``create_connect``, commit 0296f199).

Every rank-hosting process of the run is one member of a process group made from the
run's store (the parent's TCPStore on loopback for ``sim run``, torchrun's store under
:mod:`sim.node`), keyed by the run's id. Gloo binds the run's ``--host`` address. NCCL
needs one GPU per rank-hosting process on a host (two processes of a pair must sit on
different GPUs); its frames are staged through the GPU (host frame -> device buffer ->
``send``; ``recv`` -> host), so both transports carry the same bytes in the same form.

Sends are synchronous per message: a sender puts a message's manifest on ZMQ, posts a
send for each of its frames and waits until the receiver has taken them all (one
message in flight per pair; ZMQ queues up to 64). A receiver posts its receives as
soon as it reads a manifest, so every wait matches a send already under way (data
flows from stage to stage, so no two ranks wait on each other). Every wait is bounded
by the run's ``--timeout``; a pair that failed once (a peer died, a link was cut) is
not used again, and what it would have carried is reported lost by the end-of-stream.
Nothing received is unpickled: frames are raw bytes and the manifest is JSON.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from sim.net import messages
from sim.net.endpoints import RankId
from sim.net.sizing import max_receiver_message
from sim.run.config import SimConfig

MAX_FRAMES = 1 << 16
"""Frames a manifest may list (a pull answer's ranges included)."""
MANIFEST_KEY = "p2p"


class P2PError(RuntimeError):
    """The point-to-point path failed: a peer died, a link was cut, or a wait timed out."""


@dataclass(frozen=True)
class Received:
    """A frame that came over torch.distributed: it reads as a ``zmq.Frame`` does."""

    buffer: memoryview


def plan_groups(shares: list[list[RankId]], per_process: int) -> dict[str, int]:
    """Every sim rank's process-group rank: the index of the process that hosts it, the
    processes numbered worker by worker as each cuts its share into groups of
    ``per_process`` ranks (as :meth:`sim.harness.cluster.Cluster._start_hosts` does)."""
    groups: dict[str, int] = {}
    process = 0
    for share in shares:
        for i in range(0, len(share), per_process):
            for who in share[i : i + per_process]:
                groups[who.tag] = process
            process += 1
    return groups


def check_transport(config: SimConfig, processes_here: int) -> None:
    """Refuse a point-to-point transport this machine cannot run, naming what is missing."""
    import torch.distributed as dist

    if config.transport == "gloo" and not dist.is_gloo_available():
        raise ValueError("--transport gloo: this torch build has no gloo backend")
    if config.transport != "nccl":
        return
    if not torch.cuda.is_available():
        raise ValueError(
            f"--transport nccl needs CUDA, but torch.cuda.is_available() is False (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); use --transport gloo on CPU"
        )
    if not dist.is_nccl_available():
        raise ValueError(f"--transport nccl: torch {torch.__version__} has no NCCL backend")
    gpus = torch.cuda.device_count()
    if processes_here > gpus:
        raise ValueError(
            f"--transport nccl: this host runs {processes_here} rank process(es) but has "
            f"{gpus} GPU(s); NCCL needs a GPU of its own per process (raise "
            "--ranks-per-process or use --transport gloo)"
        )


class Link:
    """One rank-hosting process's membership of the run's process group, opened once by
    whichever of its ranks needs it first (the others wait on the lock)."""

    def __init__(self, config: SimConfig, plan: dict[str, Any]) -> None:
        self.config = config
        self.backend = config.transport
        self.store_address = (str(plan["store"][0]), int(plan["store"][1]))
        self.prefix = str(plan["prefix"])
        self.groups: dict[str, int] = {str(k): int(v) for k, v in plan["groups"].items()}
        self.index = {tag: i for i, tag in enumerate(self.groups)}
        self.world = int(plan["world"])
        self.rank = int(plan["rank"])
        self.device_index = int(plan.get("device", 0))
        self.timeout = timedelta(seconds=config.timeout)
        self.lock = threading.Lock()
        self.group: Any = None

    def open(self) -> None:
        import torch.distributed as dist

        with self.lock:
            if self.group is not None:
                return
            host, port = self.store_address
            store: dist.Store = dist.TCPStore(
                host, port, is_master=False, timeout=self.timeout, wait_for_workers=False
            )
            store = dist.PrefixStore(self.prefix, store)
            if self.backend == "nccl":
                torch.cuda.set_device(self.device_index)
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self.timeout
                self.group = dist.ProcessGroupNCCL(store, self.rank, self.world, options)
            else:
                options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch has it; its stubs lack it
                options._timeout = self.timeout
                options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.config.host)]
                self.group = dist.ProcessGroupGloo(store, self.rank, self.world, options)

    def carrier(self, who: RankId) -> Carrier:
        """The seam for sim rank ``who`` (opens the process group on first use)."""
        self.open()
        return Carrier(self, who)

    def tag(self, src: RankId, dst: RankId) -> int:
        """The tag of the (source, target) pair: unique in the run, below 2**31."""
        return self.index[src.tag] * len(self.index) + self.index[dst.tag]


class Carrier:
    """Sim rank ``who``'s side of the seam: :meth:`split` and :meth:`send` for what it
    puts on the wire, :meth:`join` for what it reads."""

    def __init__(self, link: Link, who: RankId) -> None:
        self.link, self.who = link, who
        self.broken: dict[str, str] = {}  # peer tag -> why its pair is not used again
        self.limit = max_receiver_message(link.config)
        self.device = (
            torch.device("cuda", link.device_index)
            if link.backend == "nccl"
            else torch.device("cpu")
        )

    def _remote(self, peer: RankId) -> bool:
        return self.link.groups[peer.tag] != self.link.groups[self.who.tag]

    def split(self, peer: RankId, frames: list[Any]) -> tuple[list[Any], list[Any]] | None:
        """(what goes on ZMQ, what goes over torch.distributed) for one message to ``peer``;
        ``None`` when its pair has failed: the message is lost whole (a manifest without
        its frames would leave the receiver waiting)."""
        if len(frames) < 2 or not self._remote(peer):
            return frames, []
        if peer.tag in self.broken:
            return None
        bulk = frames[2:]
        manifest = messages.dump({MANIFEST_KEY: [_nbytes(f) for f in bulk]})
        return [frames[0], frames[1], manifest], bulk

    def send(self, peer: RankId, bulk: list[Any]) -> None:
        """Send ``bulk``'s frames to ``peer`` and wait until it has taken them; a pair that
        fails is not used again (its messages are then lost, and reported so)."""
        if peer.tag in self.broken:
            return
        dst, tag = self.link.groups[peer.tag], self.link.tag(self.who, peer)
        try:  # every frame posted at once, then waited for: one message in flight per pair
            tensors = [_as_tensor(f).to(self.device) for f in bulk if _nbytes(f)]
            works = [self.link.group.send([t], dst, tag) for t in tensors]
            for work in works:
                work.wait(self.link.timeout)
        except Exception as error:  # gloo and NCCL raise RuntimeError subclasses
            self.broken[peer.tag] = f"{type(error).__name__}: {str(error)[:200]}"

    def join(self, peer: RankId, frames: list[Any]) -> list[Any] | None:
        """The whole message ``peer`` sent, its frames received over torch.distributed as
        the manifest lists them; ``None`` when they cannot be (see :attr:`broken`)."""
        if len(frames) < 2 or not self._remote(peer):
            return frames
        if peer.tag in self.broken:
            return None
        sizes = self._manifest(frames[-1])
        if sizes is None:
            self.broken[peer.tag] = "an unreadable manifest"
            return None
        src, tag = self.link.groups[peer.tag], self.link.tag(peer, self.who)
        out = list(frames[:-1])
        try:  # every receive posted at once (they match the sends in order), then waited for
            buffers = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in sizes]
            works = [self.link.group.recv([b], src, tag) for b in buffers if b.numel()]
            for work in works:
                work.wait(self.link.timeout)
            out += [Received(b.cpu().numpy().data.cast("B")) for b in buffers]
        except Exception as error:
            self.broken[peer.tag] = f"{type(error).__name__}: {str(error)[:200]}"
            return None
        return out

    def _manifest(self, frame: Any) -> list[int] | None:
        """The frame sizes a manifest lists, or ``None`` when it is not one this run could
        send (not JSON, too many frames, a frame larger than any of the run's: the limit
        ZMQ puts on every frame this receiver reads,
        :func:`sim.net.sizing.max_receiver_message`)."""
        try:
            manifest = messages.load(frame.buffer, limit=messages.MAX_ENVELOPE + 16 * MAX_FRAMES)
        except messages.MessageError:
            return None
        sizes = manifest.get(MANIFEST_KEY)
        if (
            not isinstance(sizes, list)
            or len(sizes) > MAX_FRAMES
            or not all(type(n) is int and 0 <= n <= self.limit for n in sizes)
        ):
            return None
        return sizes


def _nbytes(frame: Any) -> int:
    return memoryview(frame).nbytes


def _as_tensor(frame: Any) -> torch.Tensor:
    """A frame's bytes as a uint8 tensor, sharing its memory when it is writable."""
    view = memoryview(frame).cast("B")
    if view.readonly:  # an envelope-sized bytes frame, or one a fault rewrote: copy it
        view = memoryview(bytearray(view))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.frombuffer(view, dtype=torch.uint8)
