"""The run's notice board in torch.distributed's store: how torchrun workers meet and talk.

Under ``torchrun`` every worker gets a client of one c10d store (the elastic agent's
TCPStore; ``torch.distributed.rendezvous("env://")`` returns it). The sim keeps all of
its cross-host control there, under a prefix of its own, as JSON it writes and parses
itself (nothing from the store is ever unpickled):

- ``worker/<w>``: who worker ``w`` is (its host address) and a hash of its
  configuration, so that mismatched workers are refused naming both;
- ``claim/<tag>``: the worker that hosts a sim rank; a second claimant is refused;
- ``ep/<tag>``: the KV endpoint a sender really bound; receivers look it up here;
- ``mb/<src>/<dst>/<n>``: worker ``src``'s ``n``-th batch of messages to worker ``dst``
  (one writer per mailbox, so order holds without locks; read batches are deleted);
- ``phase``: ``go`` once every rank is ready and traffic starts, then ``finish``;
- ``hb/<w>``: a counter worker ``w`` bumps every second; a worker whose counter stops
  moving (by the reader's own clock, so no clocks are compared across hosts) is lost.

The store has no authentication: anyone who can reach its port can read and write it.
So nothing secret is ever written there, and every value the sim writes is signed: the
run's key comes to every worker out of band (:func:`sim.net.auth.run_key`: a 0600 key file or
an environment variable the launcher sets), each value is stored as ``{"v": value,
"mac": HMAC(board key, prefix | name | value)}``, and a value whose MAC does not verify is
refused as a stranger's (a forged worker record or claim stops the run with the reason; a
forged mailbox batch is dropped and counted). What a stranger can still do is destroy:
delete or overwrite keys (the run then fails or times out, naming the key), or bump a
heartbeat counter (``add`` takes no signature), which can hide a lost worker for as long
as it keeps bumping. It cannot read a secret, join the run, or feed it a message.

Store operations used: ``set``, ``get``, ``check``, ``add``, ``compare_set``,
``delete_key`` and ``set_timeout`` (torch/_C/_distributed_c10d.pyi, class Store).
A store that cannot be reached raises after :data:`STORE_TIMEOUT_S`; callers turn that
into a lost coordinator, never a hang.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sim.net import messages

STORE_TIMEOUT_S = 10.0
"""How long one store operation may block before the store counts as unreachable."""
BEAT_S = 0.5
"""How often a worker bumps its heartbeat counter (from a thread of its own)."""
LOST_S = 5.0
"""A worker whose heartbeat has not moved for this long is lost (its host or link died)."""
STUCK_S = 30.0
"""A worker whose board has answered nothing for this long is cut off, and ends."""
PREFIX = "kvspec-sim"


class BoardError(RuntimeError):
    """The board refused something (a mismatch, a double claim) or could not be reached."""


def config_digest(config_json: dict[str, Any]) -> str:
    """A hash of a worker's configuration, the per-host fields (``host``) left out."""
    shared = {k: v for k, v in config_json.items() if k != "host"}
    return hashlib.sha256(messages.dump(shared)).hexdigest()[:16]


def differing_fields(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``name (a vs b)`` for every shared configuration field whose values differ."""
    names = sorted((set(a) | set(b)) - {"host"})
    return [
        f"{n} ({messages.short(a.get(n), 40)} vs {messages.short(b.get(n), 40)})"
        for n in names
        if a.get(n) != b.get(n)
    ]


class Board:
    """Worker ``worker`` of ``workers``' view of the board on ``store``, signing and
    verifying every value with ``key`` (:func:`sim.net.auth.board_key`)."""

    def __init__(self, store: Any, worker: int, workers: int, run: str, *, key: bytes) -> None:
        import torch.distributed as dist

        self.prefix = f"{PREFIX}/{run}"
        self.key = key
        self.forged = 0  # mailbox batches a stranger wrote, dropped
        self.store = dist.PrefixStore(self.prefix, store)
        self.store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        self.worker, self.workers = worker, workers
        self.sent: dict[int, int] = {}  # per destination: batches posted
        self.read: dict[int, int] = {}  # per source: batches read
        self.beats: dict[int, tuple[int, float]] = {}  # worker -> (counter, when it moved)
        self.stopped = threading.Event()
        self.last_ok = time.monotonic()
        self.beater: threading.Thread | None = None

    # -- signed values ---------------------------------------------------------------
    def _mac(self, name: str, body: bytes) -> str:
        message = self.prefix.encode() + b"|" + name.encode() + b"|" + body
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def _signed(self, name: str, value: Any) -> bytes:
        return messages.dump({"v": value, "mac": self._mac(name, messages.dump({"v": value}))})

    def _verified(self, name: str, raw: bytes) -> Any:
        """The value under ``name``, refused (BoardError) unless this run's key signed it."""
        try:
            stored = messages.load(raw)
        except messages.MessageError as error:
            raise BoardError(f"{name} on the board is not this run's: {error}") from None
        mac = stored.get("mac")
        want = self._mac(name, messages.dump({"v": stored.get("v")}))
        if set(stored) != {"v", "mac"} or not isinstance(mac, str):
            raise BoardError(f"{name} on the board is not signed: someone else wrote it")
        if not hmac.compare_digest(mac, want):
            raise BoardError(
                f"{name} on the board is not signed with this run's key: someone else wrote "
                "it, or this worker was given another key (KVSPEC_SIM_KEY / --key-file)"
            )
        return stored["v"]

    # -- plain values ----------------------------------------------------------------
    def put(self, key: str, value: dict[str, Any]) -> None:
        self.store.set(key, self._signed(key, value))  # type: ignore[arg-type]  # Store takes bytes; its stubs say str

    def get(self, key: str) -> dict[str, Any]:
        """A value that must be there (or arrive within the store timeout), signed."""
        value = self._verified(key, self.store.get(key))
        if not isinstance(value, dict):
            raise BoardError(f"{key} on the board is not an object")
        return value

    def has(self, *keys: str) -> bool:
        return bool(self.store.check(list(keys)))

    def wait_for(self, keys: list[str], deadline: float, what: str) -> None:
        """Poll until every key is there; past ``deadline``, name the ones missing."""
        while True:
            missing = [k for k in keys if not self.store.check([k])]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise BoardError(f"{what}: still missing {', '.join(missing[:8])}")
            time.sleep(0.05)

    # -- joining ---------------------------------------------------------------------
    def join(self, host: str, config_json: dict[str, Any], deadline: float) -> list[dict]:
        """Publish who this worker is; wait for every worker; refuse a mismatch.

        Returns every worker's record, by worker number.
        """
        allowed = max(0.0, deadline - time.monotonic())
        self.put(
            f"worker/{self.worker}",
            {"host": host, "digest": config_digest(config_json), "config": config_json},
        )
        self.wait_for(
            [f"worker/{w}" for w in range(self.workers)],
            deadline,
            f"workers never joined the board within {allowed:.3g} s ({self.workers} expected)",
        )
        records = [self.get(f"worker/{w}") for w in range(self.workers)]
        first = records[0]
        for w, record in enumerate(records[1:], start=1):
            if record.get("digest") != first.get("digest"):
                fields = differing_fields(first.get("config", {}), record.get("config", {}))
                raise BoardError(
                    f"mismatched configurations: worker 0 on {first.get('host')} runs "
                    f"{first.get('digest')}, worker {w} on {record.get('host')} runs "
                    f"{record.get('digest')}; differing: {', '.join(fields) or '?'}"
                )
        return records

    def claim(self, tags: list[str], host: str) -> None:
        """Claim this worker's sim ranks; a rank another worker holds is refused."""
        mine = f"worker {self.worker} on {host}"
        for tag in tags:
            name = f"claim/{tag}"
            value = self._signed(name, mine)
            held = self.store.compare_set(name, "", value)  # type: ignore[arg-type]  # bytes, as in put()
            if held != value:
                raise BoardError(
                    f"rank {tag} is claimed twice: by {self._verified(name, held)} and by {mine}"
                )

    # -- endpoints -------------------------------------------------------------------
    def publish_endpoint(self, tag: str, endpoint: str | None) -> None:
        self.put(f"ep/{tag}", {"endpoint": endpoint})

    def endpoints(self, tags: list[str]) -> dict[str, str]:
        """The endpoints senders published, by tag (senders that bound none left out)."""
        found = {}
        for tag in tags:
            endpoint = self.get(f"ep/{tag}").get("endpoint")
            if isinstance(endpoint, str):
                found[tag] = endpoint
        return found

    # -- mailboxes -------------------------------------------------------------------
    def post(self, dst: int, batch: list[dict[str, Any]]) -> None:
        """Send ``batch`` (a list of JSON messages) to worker ``dst``, in order."""
        if not batch:
            return
        n = self.sent.get(dst, 0)
        self.put(f"mb/{self.worker}/{dst}/{n}", {"batch": batch})
        self.sent[dst] = n + 1

    def receive(self, sources: list[int]) -> list[tuple[int, dict[str, Any]]]:
        """Every message posted to this worker by ``sources`` since the last call."""
        out = []
        for src in sources:
            while True:
                n = self.read.get(src, 0)
                key = f"mb/{src}/{self.worker}/{n}"
                if not self.store.check([key]):
                    break
                try:
                    batch = self.get(key).get("batch", [])
                except BoardError:  # a stranger's: dropped, and the writer's awaited
                    self.forged += 1
                    self.store.delete_key(key)
                    break
                self.store.delete_key(key)
                self.read[src] = n + 1
                out += [(src, m) for m in batch if isinstance(m, dict)]
        self.last_ok = time.monotonic()
        return out

    # -- liveness --------------------------------------------------------------------
    def start_beating(self) -> None:
        """Bump this worker's heartbeat every :data:`BEAT_S` from a thread of its own, so
        a busy or sleeping main loop is never mistaken for a lost host (the store's
        client serialises its operations, so the thread may share it)."""

        def beat() -> None:
            while not self.stopped.wait(BEAT_S):
                try:
                    self.store.add(f"hb/{self.worker}", 1)
                except Exception:  # the store is gone: the main loop will find out
                    return

        self.beater = threading.Thread(target=beat, name="kvspec-heartbeat", daemon=True)
        self.beater.start()

    def stop_beating(self) -> None:
        self.stopped.set()

    def start_watchdog(self, on_stuck: Callable[[float], None]) -> None:
        """Call ``on_stuck(seconds)`` from a thread when no :meth:`receive` has completed
        for :data:`STUCK_S`: a store operation blocked on a cut link may not honour the
        store's timeout, and a worker cut off must still end (and so its ranks)."""

        def watch() -> None:
            while not self.stopped.wait(1.0):
                idle = time.monotonic() - self.last_ok
                if idle > STUCK_S:
                    on_stuck(idle)
                    return

        threading.Thread(target=watch, name="kvspec-store-watchdog", daemon=True).start()

    def silent_for(self, worker: int) -> float:
        """Seconds since worker ``worker``'s heartbeat last moved, by this worker's clock."""
        count = self.store.add(f"hb/{worker}", 0)
        now = time.monotonic()
        last = self.beats.get(worker)
        if last is None or last[0] != count:
            self.beats[worker] = (count, now)
            return 0.0
        return now - last[1]
