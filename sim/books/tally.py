"""The tally of a run: each request's outcome across every receiving rank, and the bytes
per edge, from what the ranks report, beside the bytes the plan says they move [PLAN-5,
ORACLE-5]. :class:`sim.books.report.SimReport` holds and renders what this counts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.net.endpoints import RankId
from sim.run.config import SimConfig
from sim.run.workload import Workload


@dataclass
class RequestOutcome:
    """One request of one replica group, across every receiving rank of the chain."""

    replica: int
    request_id: str
    ok: bool
    reasons: list[str]
    latency_s: float | None = None
    ready_s: dict[int, float] = field(default_factory=dict)
    """Per stage pair (by its sending stage): from the first source starting to compute the
    request to every receiver holding all its layers (``--stream`` runs) [STREAM-1]."""
    elements: int = 0
    """Elements its receiving ranks compared with the oracle, summed over them [ORACLE-5]."""
    checked_bytes: int = 0
    """The bytes of those elements (scales and record fields included)."""


def planned_edge_bytes(config: SimConfig) -> dict[tuple[int, int, int, int], int]:
    """(replica, stage, src, dst) -> bytes the plan says the run's requests move [PLAN-5];
    of a hybrid, every layer group's edges between the pair summed [GROUP-3]."""
    planned: dict[tuple[int, int, int, int], int] = defaultdict(int)
    if config.content == "groups":  # a hybrid's edges, group by group [GROUP-3]
        for replica in range(config.replicas):
            workload = Workload(config, replica)
            for stage in range(config.last_stage):
                plans = workload.plans(stage)
                for request in workload.requests:
                    for g in plans.groups_of(request).edges:
                        planned[(replica, stage, g.src, g.dst)] += g.nbytes
        return dict(planned)
    # A record cache moves every field of a cell, inline scales too [LAYOUT-6, DESC-1].
    cell, kv_bytes = config.cell_bytes, config.transfer_model.bytes_per_token_per_head_layer
    for replica in range(config.replicas):
        workload = Workload(config, replica)
        for stage in range(config.last_stage):
            plans = workload.plans(stage)
            for request in workload.requests:  # each request by its own plan [PLAN-6, DP-1]
                for e in plans.of(request).edges:
                    key = (replica, stage, e.src, e.dst)
                    planned[key] += (
                        e.nbytes(request.seq_len, slicing=config.slicing) // kv_bytes * cell
                    )
    return dict(planned)


def planned_group_bytes(config: SimConfig) -> dict[int, int]:
    """Of a hybrid, layer group -> bytes its group plans move for the run's requests, every
    group listed [GROUP-3]; of any other model, nothing."""
    if config.content != "groups":
        return {}
    planned = dict.fromkeys(range(len(config.model.layer_groups)), 0)
    for replica in range(config.replicas):
        workload = Workload(config, replica)
        for stage in range(config.last_stage):
            plans = workload.plans(stage)
            for request in workload.requests:
                for g, n in plans.groups_of(request).bytes_by_group().items():
                    planned[g] += n
    return planned


def measured_group_bytes(results: dict[RankId, dict[str, dict[str, Any]]]) -> dict[int, int]:
    """Of a hybrid, layer group -> bytes its verified requests moved [GROUP-3]."""
    moved: dict[int, int] = defaultdict(int)
    for by_request in results.values():
        for event in by_request.values():
            if event["ok"]:
                for g, n in event.get("group_bytes", {}).items():
                    moved[int(g)] += n
    return dict(moved)


def outcomes_from(
    config: SimConfig,
    results: dict[RankId, dict[str, dict[str, Any]]],
    missing_reason: Callable[[RankId, str], str],
) -> list[RequestOutcome]:
    """One outcome per request: verified only if every receiving rank verified it."""
    outcomes = []
    for replica in range(config.replicas):
        for request in Workload(config, replica).requests:
            reasons, first_sent, verified_at = [], [], []
            elements = checked = 0
            started: dict[int, list[float]] = defaultdict(list)
            ready: dict[int, list[float]] = defaultdict(list)
            for stage in range(1, len(config.stages)):
                for rank in config.stages[stage].ranks():
                    who = RankId(replica, stage, rank)
                    event = results.get(who, {}).get(request.request_id)
                    if event is None:
                        reasons.append(
                            f"stage {stage} rank {rank}: {missing_reason(who, request.request_id)}"
                        )
                    elif not event["ok"]:
                        reasons.append(f"stage {stage} rank {rank}: {event['reason']}")
                    else:
                        elements += event.get("elements", 0)
                        checked += event.get("checked_bytes", 0)
                        if event.get("started") is not None and event.get("ready") is not None:
                            started[stage - 1].append(event["started"])
                            ready[stage - 1].append(event["ready"])
                        if stage == 1:
                            first_sent.append(event["first_sent"])
                        if stage == config.last_stage:
                            verified_at.append(event["verified"])
            latency = max(verified_at) - min(first_sent) if not reasons else None
            spans = {s: max(ready[s]) - min(started[s]) for s in ready} if not reasons else {}
            outcomes.append(
                RequestOutcome(
                    replica,
                    request.request_id,
                    not reasons,
                    reasons,
                    latency,
                    spans,
                    elements if not reasons else 0,
                    checked if not reasons else 0,
                )
            )
    return outcomes


def measured_edge_bytes(
    results: dict[RankId, dict[str, dict[str, Any]]],
) -> tuple[dict[tuple[int, int, int, int], int], float, float]:
    """Bytes per edge from receivers' results, and the transfer window's start and end."""
    edges: dict[tuple[int, int, int, int], int] = defaultdict(int)
    start, end = float("inf"), 0.0
    for who, by_request in results.items():
        for event in by_request.values():
            if not event["ok"]:
                continue
            for src, n in event["edge_bytes"].items():
                edges[(who.replica, who.stage - 1, int(src), who.rank)] += n
            start = min(start, event["first_sent"])
            end = max(end, event["received"])
    return dict(edges), start, end
