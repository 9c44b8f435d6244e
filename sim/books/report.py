"""The books of a run: every request verified or failed with its reason, bytes per edge
against the plan, throughput and latency; rendered for people and as JSON."""

from __future__ import annotations

import ipaddress
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvspec.console.units import human_bytes
from sim.books.accounting import BY_REQUEST, MESSAGE_FAULTS, RANK_FAULTS, count
from sim.books.tally import RequestOutcome
from sim.run.config import ENGINE_NAMES, ONE_SIDED, UNAUTHENTICATED, SimConfig

PULL_STATS: tuple[str, ...] = (
    "descriptors",
    "descriptor_bytes",
    "requests_pulled",
    "reads_posted",
    "reads_refused",
    "onesided_transfers",
    "onesided_descriptors",
    "onesided_notifications",
    "onesided_refused",
    "onesided_errors",
)
"""Counters a pull run's receivers (and senders, for refused reads) report [sim.paths.pull]."""


@dataclass
class SimReport:
    """Everything a run found; ``ok`` only when every request verified and nothing broke."""

    config: SimConfig
    outcomes: list[RequestOutcome]
    edge_bytes: dict[tuple[int, int, int, int], int]
    planned_bytes: dict[tuple[int, int, int, int], int]
    sender_stats: dict[str, dict[str, Any]]
    receiver_stats: Counter[str] = field(default_factory=Counter)
    group_bytes: dict[int, int] = field(default_factory=dict)
    """Of a hybrid, bytes per layer group its verified requests moved [GROUP-3]."""
    planned_group_bytes: dict[int, int] = field(default_factory=dict)
    """Of a hybrid, bytes per layer group its group plans move (every group listed)."""
    wall_s: float = 0.0
    transfer_s: float = 0.0
    startup_s: float = 0.0
    """From the start of the run until every rank had bound, connected and handshaken."""
    processes: int = 0
    errors: list[str] = field(default_factory=list)
    setup_error: str | None = None
    """Why the run could not start (a rank failed to set up, bind or connect), if so."""
    dead: list[str] = field(default_factory=list)
    timed_out: bool = False
    interrupted: bool = False
    stack_dumps: str = ""
    fault_keys: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """``{"injected": {fault: [key or rank, ...]}, "observed": {...}}`` (sim.books.accounting)."""
    library_errors: dict[str, list[str]] = field(default_factory=dict)
    """The transfers a transfer library failed, by library (``NIXL``, ``Mooncake``): which
    and the library's words; its own verdict, never a fault (sim.books.accounting)."""
    books_closed: int = 0
    """Ranks whose final books arrived."""
    strangers: dict[str, int] = field(default_factory=dict)
    """Messages and connections from outside the run, dropped, by where they arrived."""
    lifecycle: dict[str, Any] = field(default_factory=dict)
    """Corruption found in held blocks, trace violations, traces checked [LIFE]."""
    baseline: SimReport | None = None
    """A streamed run's whole-request twin: the same run with ``--stream whole``."""
    marks: dict[str, float] = field(default_factory=dict)
    """``time.time()`` as each phase of the run ended: ``started`` (validated, about to
    start ranks), ``go`` (every rank ready), ``results`` (every result in or the
    deadline), ``stopped`` (every rank stopped) (:mod:`sim.harness.cluster`)."""
    clock: tuple[float, float, str] | None = None
    """(start, end, what the start is) of the whole command, set by :meth:`time_command`."""

    def time_command(self, started: float, since: str) -> None:
        """Time the command around the run: from ``started`` (``time.time()`` of ``since``,
        e.g. the process's start) to now, when the report is made, so the wall time it
        shows is the one ``time`` shows for the command."""
        self.clock = (started, time.time(), since)

    def wall_split(self) -> dict[str, Any] | None:
        """The command's wall time, split into start-up, transfer and shutdown, which add up
        to the total; None unless :meth:`time_command` was called."""
        if self.clock is None or "started" not in self.marks:
            return None
        started, ended, since = self.clock
        ranks = self.marks["started"]
        stopped = self.marks.get("stopped", ended)
        go = self.marks.get("go", stopped)  # a run that never started: all start-up
        results = self.marks.get("results", go)
        return {
            "since": since,
            "total_seconds": ended - started,
            "startup_seconds": go - started,
            "before_ranks_seconds": ranks - started,
            "ranks_startup_seconds": go - ranks,
            "transfer_seconds": results - go,
            "shutdown_seconds": ended - results,
        }

    @property
    def elements_verified(self) -> int:
        """Elements compared with the oracle, equal, in the verified requests."""
        return sum(o.elements for o in self.outcomes if o.ok)

    @property
    def bytes_verified(self) -> int:
        return sum(o.checked_bytes for o in self.outcomes if o.ok)

    @property
    def receiving_ranks(self) -> int:
        """Ranks that receive and verify: every stage's but the first, in every group."""
        stages = self.config.stages[1:]
        return sum(s.world_size for s in stages) * self.config.replicas

    def edges_off_plan(self) -> int:
        """Edges whose bytes moved (by verified requests) differ from the plan's."""
        return sum(
            self.edge_bytes.get(key, 0) != planned for key, planned in self.planned_bytes.items()
        )

    @property
    def verified(self) -> int:
        return sum(o.ok for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(not o.ok for o in self.outcomes)

    @property
    def corrupted(self) -> list[dict[str, Any]]:
        """Requests found corrupted when their held blocks were verified again at the end."""
        return list(self.lifecycle.get("corrupted", []))

    @property
    def violations(self) -> list[dict[str, Any]]:
        """Ranks whose lifecycle trace broke a rule, with the first violation."""
        return list(self.lifecycle.get("violations", []))

    @property
    def ok(self) -> bool:
        return (
            self.failed == 0
            and not self.errors
            and not self.interrupted
            and not self.timed_out
            and not self.corrupted
            and not self.violations
            and not self.library_errors
        )

    @property
    def bytes_moved(self) -> int:
        return sum(self.edge_bytes.values())

    @property
    def throughput_gbps(self) -> float:
        return self.bytes_moved / self.transfer_s / 1e9 if self.transfer_s > 0 else 0.0

    @property
    def throughput_bytes_per_s(self) -> float:
        return self.bytes_moved / self.transfer_s if self.transfer_s > 0 else 0.0

    def latencies(self) -> list[float]:
        return sorted(o.latency_s for o in self.outcomes if o.ok and o.latency_s is not None)

    def percentile(self, q: float) -> float | None:
        values = self.latencies()
        if not values:
            return None
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]

    def kv_ready(self, stage: int) -> list[float]:
        """KV-ready latencies of the verified requests on stage pair ``stage -> stage+1``."""
        return sorted(o.ready_s[stage] for o in self.outcomes if o.ok and stage in o.ready_s)

    def kv_ready_lines(self) -> list[str]:
        """Per stage pair: KV-ready p50/p99, against the whole-request twin when there is one."""
        c = self.config
        if c.stream == "off":
            return []
        how = (
            f"{c.stream}, {c.layer_compute_ms:g} ms compute per layer"
            if c.stream == "whole"
            else f"streamed as {c.stream_groups} layer group(s), {c.layer_compute_ms:g} ms "
            "compute per layer"
        )
        lines = [
            f"KV ready:   from the sender starting to compute a request to every layer in the "
            f"receiver's cache ({how})"
        ]
        for stage in range(c.last_stage):
            pair = f"{c.stages[stage].describe()}->{c.stages[stage + 1].describe()}"
            got = self.kv_ready(stage)
            if not got:
                lines.append(f"  stage {stage}->{stage + 1} {pair}: n/a (no request verified)")
                continue
            p50, p99 = _pct(got, 50), _pct(got, 99)
            text = (
                f"  stage {stage}->{stage + 1} {pair}: p50 {p50 * 1e3:.1f} ms, "
                f"p99 {p99 * 1e3:.1f} ms"
            )
            base = self.baseline.kv_ready(stage) if self.baseline is not None else []
            if base:
                b50 = _pct(base, 50)
                text += (
                    f"; whole-request {b50 * 1e3:.1f} ms p50 (measured: the same run with "
                    f"--stream whole, just before): {b50 / max(p50, 1e-9):.2f}x sooner"
                )
            lines.append(text)
        return lines

    def faulted_keys(self, name: str, side: str = "injected") -> set[str]:
        """The keys of the data messages fault ``name`` struck (``drop``, ``corrupt``, ...),
        as booked where it was injected (or, with ``side="observed"``, where observed)."""
        return set(self.fault_keys.get(side, {}).get(name, []))

    def fault_counts(self) -> dict[str, dict[str, int]]:
        """fault -> {"injected": n, "observed": m}."""
        kinds = sorted(
            set(self.fault_keys.get("injected", {})) | set(self.fault_keys.get("observed", {}))
        )
        return {
            k: {
                side: count(k, self.fault_keys.get(side, {}).get(k, []))
                for side in ("injected", "observed")
            }
            for k in kinds
        }

    def faults_injected(self) -> dict[str, int]:
        return {k: c["injected"] for k, c in self.fault_counts().items() if c["injected"]}

    def unbalanced_faults(self) -> dict[str, dict[str, int]]:
        """Countable faults whose injected and observed counts differ (sim.books.accounting).

        Corruption counts only with checksums on: without them a flipped bit is observed
        by the oracle, and only in requests that have not failed already.
        """
        countable = [*MESSAGE_FAULTS, *RANK_FAULTS, *BY_REQUEST]
        if not self.config.checksum:
            countable.remove("corrupt")
        return {
            k: c
            for k, c in self.fault_counts().items()
            if k in countable and c["injected"] != c["observed"]
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "config": self.config.to_dict(),
            "requests": {
                "total": len(self.outcomes),
                "verified": self.verified,
                "failed": self.failed,
            },
            "failures": [
                {"replica": o.replica, "request": o.request_id, "reasons": o.reasons}
                for o in self.outcomes
                if not o.ok
            ],
            "edges": [
                {
                    "replica": r,
                    "stage": s,
                    "src": src,
                    "dst": dst,
                    "bytes": self.edge_bytes.get((r, s, src, dst), 0),
                    "planned_bytes": planned,
                }
                for (r, s, src, dst), planned in sorted(self.planned_bytes.items())
            ],
            "bytes_moved": self.bytes_moved,
            "layer_groups": [
                {
                    "group": g,
                    "kind": self.config.model.layer_groups[g].kind,
                    "bytes": self.group_bytes.get(g, 0),
                    "planned_bytes": planned,
                }
                for g, planned in sorted(self.planned_group_bytes.items())
            ],
            "verified": {
                "requests": self.verified,
                "of": len(self.outcomes),
                "elements": self.elements_verified,
                "bytes": self.bytes_verified,
                "receiving_ranks": self.receiving_ranks,
                "edges": len(self.planned_bytes),
                "edges_off_plan": self.edges_off_plan(),
            },
            "transfer_seconds": self.transfer_s,
            "throughput_gbps": self.throughput_gbps,
            "throughput_bytes_per_second": self.throughput_bytes_per_s,
            "measured_on": self.measured_on(),
            "latency_seconds": {"p50": self.percentile(50), "p99": self.percentile(99)},
            "wall_seconds": self.wall_s,
            "startup_seconds": self.startup_s,
            "command_wall": self.wall_split(),
            "processes": self.processes,
            "faults": self.fault_counts(),
            "faults_unbalanced": self.unbalanced_faults(),
            "library_errors": self.library_errors,
            "books_closed": self.books_closed,
            "strangers": self.strangers,
            "lifecycle": self.lifecycle,
            "receivers": dict(self.receiver_stats),
            "dead_ranks": self.dead,
            "setup_error": self.setup_error,
            "errors": self.errors,
            "timed_out": self.timed_out,
            "interrupted": self.interrupted,
            "transfer": self.config.transfer,
            "descriptors": self.descriptor_summary(),
            "stream": self.config.stream,
            "kv_ready_seconds": {
                str(stage): {
                    "p50": _pct(got, 50) if (got := self.kv_ready(stage)) else None,
                    "p99": _pct(got, 99) if got else None,
                    "whole_request_p50": (
                        _pct(base, 50)
                        if self.baseline is not None and (base := self.baseline.kv_ready(stage))
                        else None
                    ),
                }
                for stage in range(self.config.last_stage)
            }
            if self.config.stream != "off"
            else {},
        }

    def verified_lines(self) -> list[str]:
        """What the run checked and found equal, from its counters: the requests whose
        every element on every receiving rank equals the oracle, and the edges whose bytes
        equal the plan's. Only what the ranks and :func:`planned_edge_bytes` compare."""
        total, edges = len(self.outcomes), len(self.planned_bytes)
        ranks = self.receiving_ranks
        found = f"{self.verified} of {total} request(s)"
        if self.verified:
            found += (
                f": every element the {ranks} receiving rank(s) hold of them equals the "
                f"coordinate-hash oracle, bit for bit ({self.elements_verified:,} elements, "
                f"{human_bytes(self.bytes_verified)})"
            )
        if self.failed:
            found += f"; {self.failed} failed, each with its first reason below"
        off = self.edges_off_plan()
        return [
            f"verified:   {found}",
            f"            {edges - off} of {edges} edge(s) moved exactly the plan's bytes for "
            "these requests [PLAN-5]" + (f"; {off} differ (marked below)" if off else ""),
        ]

    def measured_on(self) -> str:
        """Where the run's timings come from: its ranks, their links, their caches."""
        c = self.config
        if c.transport == "inproc":
            ranks = "threads of one Python process over inproc:// ZMQ sockets"
        else:
            try:
                loopback = ipaddress.ip_address(c.host).is_loopback
            except ValueError:
                loopback = c.host == "localhost"
            link = "loopback" if loopback else c.host
            ranks = f"{self.processes} Python process(es), ZMQ over {link}"
            if c.p2p:
                ranks += f", tensor frames over torch.distributed ({c.transport})"
            if c.transport in ONE_SIDED:
                ranks += f", KV one-sided through {ENGINE_NAMES[c.transport]}"
        return f"{ranks}, caches on {c.device}"

    def wall_lines(self) -> list[str]:
        """The wall time: the whole command's, split so the parts add up to it, when the
        CLI timed it (:meth:`time_command`); else the run's, from starting the ranks."""
        split = self.wall_split()
        ranks = sum(s.world_size for s in self.config.stages) * self.config.replicas
        started = (
            f"{self.processes} rank process(es)" if self.processes else f"{ranks} rank thread(s)"
        )
        if split is None:
            return [
                f"wall time:  {self.wall_s:.2f} s from starting the ranks to stopping them, "
                f"{started}, {self.startup_s:.2f} s of it starting them up"
            ]
        before = "the interpreter, imports and validation" + (
            ", the whole-request twin run" if self.baseline is not None else ""
        )
        return [
            f"wall time:  {split['total_seconds']:.2f} s from {split['since']} to this report:",
            f"  start-up  {split['startup_seconds']:.2f} s: {before} "
            f"{split['before_ranks_seconds']:.2f} s; {started} started and handshaken "
            f"{split['ranks_startup_seconds']:.2f} s",
            f"  transfer  {split['transfer_seconds']:.2f} s: from go to the last request verified",
            f"  shutdown  {split['shutdown_seconds']:.2f} s: books closed, every rank stopped",
        ]

    def descriptor_summary(self) -> dict[str, float] | None:
        """A pull or write run's descriptors: in all, per request (over every receiving
        rank and source) and bytes per descriptor [DESC-3]; None for a push run or a
        hybrid's."""
        if self.config.transfer == "push" or self.config.content == "groups":
            return None  # a hybrid's reads name keys, not descriptors [sim.paths.groups]
        count = self.receiver_stats.get("descriptors", 0)
        nbytes = self.receiver_stats.get("descriptor_bytes", 0)
        requests = max(1, self.config.requests * self.config.replicas)
        return {
            "descriptors": count,
            "per_request": count / requests,
            "bytes_per_descriptor": nbytes / count if count else 0.0,
            "reads_refused": self.receiver_stats.get("reads_refused", 0),
        }

    def render(self) -> str:
        c = self.config
        chain = " -> ".join(s.describe() for s in c.stages)
        ranks = sum(s.world_size for s in c.stages) * c.replicas
        where = (
            "threads in one process"
            if c.transport == "inproc"
            else (
                f"{self.processes} process(es), "
                + (f"ports from {c.base_port}" if c.ports == "spec" else "OS-assigned ports")
                + f" on {c.host}"
                + (f", tensor frames over torch.distributed ({c.transport})" if c.p2p else "")
                + (
                    f", KV through {ENGINE_NAMES[c.transport]}, one transfer per key"
                    if c.transport in ONE_SIDED
                    else ""
                )
            )
        )
        caches = (
            f"layer-group regions (block {c.src_block_size}) -> (block {c.dst_block_size})"
            if c.content == "groups"
            else f"caches {c.src_layout.ref} (block {c.src_block_size}) -> "
            f"{c.dst_layout.ref} (block {c.dst_block_size})"
        )
        lines = [
            *(
                [
                    f"UNAUTHENTICATED TRANSPORT (--allow-unauthenticated-transport): {c.transport}"
                    f" lets anyone who reaches its port read and write the ranks' caches"
                ]
                if c.allow_unauthenticated_transport and c.transport in UNAUTHENTICATED
                else []
            ),
            f"kvspec sim: {chain}, {c.model.describe()}, {c.replicas} replica group(s)",
            f"  {ranks} ranks as {where}; {caches}; "
            + (
                {"pull": "pulled key by key"}.get(c.transfer, "pushed")
                + " as layer-group pieces [GROUP-3]"
                if c.content == "groups"
                else {
                    "pull": "pulled by descriptors",
                    "write": "written by descriptors, zero-copy",
                }.get(c.transfer, f"{c.slicing}-side slicing")
            )
            + f", replica policy {c.policy}, device {c.device}",
            f"  {c.requests} request(s) per group of {c.seq_len[0]}..{c.seq_len[1]} tokens in "
            f"{c.chunks} chunk(s); stage 0 fills its caches from the coordinate-hash oracle; "
            f"faults: {c.faults.describe()}",
            "",
        ]
        verdict = "ALL VERIFIED" if self.ok else "FAILED"
        lines.append(
            f"requests: {self.verified} verified, {self.failed} failed, of {len(self.outcomes)} "
            f"— {verdict} (every element checked against the coordinate-hash oracle)"
        )
        lines += self.verified_lines()
        for o in [o for o in self.outcomes if not o.ok][:10]:
            lines.append(f"  replica {o.replica} {o.request_id}: {o.reasons[0]}")
        if self.failed > 10:
            lines.append(f"  ... and {self.failed - 10} more (see --json)")
        lines += ["", "bytes per edge (KV moved / the plan's bytes for these requests):"]
        mismatched = self.edges_off_plan()
        shown = sorted(self.planned_bytes.items())[:12]
        for (r, s, src, dst), planned in shown:
            got = self.edge_bytes.get((r, s, src, dst), 0)
            mark = "" if got == planned else "   <- differs"
            lines.append(
                f"  replica {r} stage {s}->{s + 1}  {src:>3} -> {dst:<3} {human_bytes(got):>10} / "
                f"{human_bytes(planned):<10}{mark}"
            )
        if len(self.planned_bytes) > len(shown):
            lines.append(f"  ... {len(self.planned_bytes) - len(shown)} more edges (see --json)")
        lines.append(
            f"  {len(self.planned_bytes)} edges, {human_bytes(self.bytes_moved)} moved; "
            + (
                "every edge equals the plan"
                if not mismatched
                else f"{mismatched} differ from the plan"
            )
        )
        if self.planned_group_bytes:  # a hybrid [GROUP-3]
            lines += ["", "bytes per layer group (moved / the plan's bytes for these requests):"]
            for g, planned in sorted(self.planned_group_bytes.items()):
                model = c.model
                lines.append(
                    f"  group {g}  {model.layer_groups[g].kind:<7} "
                    f"{len(model.group_layers(g)):>3} layers  "
                    f"{human_bytes(self.group_bytes.get(g, 0)):>10} / {human_bytes(planned)}"
                )
        if c.content == "groups" and c.transfer == "pull":  # [sim.paths.groups]
            lines.append(
                f"  pulled key by key: {self.receiver_stats.get('reads_posted', 0)} reads, "
                f"{self.receiver_stats.get('reads_refused', 0)} refused"
            )
        pulled = self.descriptor_summary()
        if pulled is not None:  # pull [sim.paths.pull]
            lines.append(
                f"  {'pulled' if c.transfer == 'pull' else 'written'} with "
                f"{pulled['descriptors']} descriptors: "
                f"{pulled['per_request']:.1f} per request, "
                f"{pulled['bytes_per_descriptor']:.1f} bytes per descriptor"
            )
        p50, p99 = self.percentile(50), self.percentile(99)
        latency = (
            "n/a"
            if p50 is None or p99 is None
            else f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms"
        )
        lines += [
            "",
            f"throughput: {human_rate(self.throughput_bytes_per_s)} over {self.transfer_s:.2f} s "
            "from the first shard sent to the last received"
            + (" (verification after)" if c.verify_after else " (verifying as requests land)"),
            f"            the simulator's, on this machine ({self.measured_on()}): a correctness "
            "harness, not a performance figure",
            f"latency:    {latency} (first shard sent to request verified, end to end)",
            *self.kv_ready_lines(),
            *self.wall_lines(),
        ]
        counts = self.fault_counts()
        if counts:
            lines.append(
                "faults:     "
                + ", ".join(
                    f"{k} {c['injected']} injected / {c['observed']} observed"
                    for k, c in counts.items()
                )
            )
            unbalanced = self.unbalanced_faults()
            lines.append(
                "            books balance: every fault counted where injected and where observed"
                if not unbalanced
                else f"            books DO NOT balance for {', '.join(unbalanced)}"
            )
        for library, failed in sorted(self.library_errors.items()):
            lines.append(
                f"library:    {library} failed {len(failed)} transfer(s): its own errors, "
                "not faults (none is booked as one)"
            )
            lines += [f"  {what}" for what in failed[:5]]
        life = self.lifecycle
        if life.get("traces"):
            lines.append(
                f"lifecycle:  {life['traces']} trace(s), {life['events']} events checked "
                f"against LIFE-1..7: "
                + (
                    "every rule kept"
                    if not self.violations
                    else f"{len(self.violations)} broke a rule"
                )
                + f"; {life.get('reused', 0)} block(s) reused"
                + f"; {len(self.corrupted)} held request(s) corrupted"
                + (f"; {life['poisoned']} block(s) poisoned" if life.get("poisoned") else "")
            )
            for v in self.violations[:5]:
                lines.append(f"  {v['rank']} ({v['trace']}): {v['violation']}")
            for hit in self.corrupted[:5]:
                lines.append(f"  {hit['rank']} {hit['request']}: {hit['why']}")
        if self.strangers:
            lines.append(
                "strangers:  dropped "
                + ", ".join(f"{n} {where}" for where, n in sorted(self.strangers.items()))
                + " (not from this run's ranks)"
            )
        if self.dead:
            lines.append(f"dead ranks: {', '.join(self.dead)}")
        if self.setup_error:
            lines += ["", f"the run could not start: {self.setup_error}"]
        for error in self.errors:
            lines += ["", "error:", error.rstrip()]
        if self.timed_out:
            lines += ["", f"the run hit its {c.timeout:g} s deadline; stacks of stuck ranks:"]
            lines.append(self.stack_dumps.rstrip() or "  (none captured)")
        if self.interrupted:
            lines += ["", "interrupted (Ctrl-C): the numbers above are partial"]
        return "\n".join(line.rstrip() for line in lines)


def human_rate(bytes_per_s: float) -> str:
    """A rate in the unit that keeps it readable: ``512 B/s``, ``3.2 KiB/s``, ``12.4 MiB/s``."""
    return f"{human_bytes(round(bytes_per_s))}/s"


def _pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile of sorted ``values`` (nearest rank)."""
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]
