"""A hybrid rank's memory: the region it holds of every layer group of every request, the
values there, and how often each element landed [GROUP-1, GROUP-3, STATE-2, WINDOW-1].

Every rule is :mod:`kvspec.tensors.group_reshard`'s: what a rank holds of a group
(:func:`~kvspec.tensors.group_reshard.held_region`, a sliding-window receiver only its
window), the oracle's values (``fill``), the pieces an edge of the group plan carries
(``cut``), where a piece lands (``place``, which refuses coordinates the rank does not
hold) and the verdict (``check_region``: every element exactly once, bit for bit). This
module only keeps the regions of one rank, request by request.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.tensors import group_reshard as gr
from sim.net.endpoints import RankId
from sim.run.config import SimConfig
from sim.run.workload import PlanBook, Request, Workload


@dataclass
class Holding:
    """What one rank holds of one request: its region, values and landing counts per layer
    group (groups it holds nothing of are absent)."""

    regions: dict[int, gr.Region]
    data: dict[int, gr.GroupData]
    counts: dict[int, gr.GroupData]


@dataclass(frozen=True)
class GroupVerdict:
    """The oracle's verdict on every group region of a request [ORACLE-5]: the fields the
    rank loop reads of any verdict."""

    ok: bool
    message: str
    total: int
    """Elements compared."""
    mismatches: int


class GroupMemory:
    """The group regions of one rank (see the module)."""

    def __init__(self, config: SimConfig, who: RankId, workload: Workload) -> None:
        self.config, self.who, self.workload = config, who, workload
        self.model = config.model
        self.layout = config.stages[who.stage]
        self.block_size = config.layout_of(who.stage)[1]
        self.holdings: dict[str, Holding] = {}

    def build(self) -> None:
        """Every request's regions, zeroed, with zeroed landing counts."""
        for request in self.workload.requests:
            regions = {
                g: gr.held_region(
                    self.layout,
                    self.model,
                    g,
                    self.who.rank,
                    seq_len=request.seq_len,
                    block_size=self.block_size,
                    receiving=self.who.stage > 0,
                )
                for g in range(len(self.model.layer_groups))
            }
            regions = {g: r for g, r in regions.items() if not r.empty()}
            data = {g: gr.empty(self.model, r) for g, r in regions.items()}
            counts = {g: gr.counters(d) for g, d in data.items()}
            self.holdings[request.request_id] = Holding(regions, data, counts)

    def fill_from_oracle(self) -> None:
        """Stage 0: every region of every request from the oracles [ORACLE-1, ORACLE-4]."""
        for request_id, holding in self.holdings.items():
            for g, region in holding.regions.items():
                holding.data[g] = gr.fill(
                    self.model,
                    region,
                    request_id,
                    layout=self.layout,
                    rank=self.who.rank,
                    seed=self.config.seed,
                )

    def pieces(self, plans: PlanBook, request: Request, dst: int) -> list[gr.Piece]:
        """The pieces this sender owes receiver ``dst`` of ``request``: every edge of the
        group plan between the two, cut from this rank's regions [GROUP-3, STATE-2]."""
        holding = self.holdings[request.request_id]
        out: list[gr.Piece] = []
        for edge in plans.groups_of(request).edges:
            if edge.src == self.who.rank and edge.dst == dst:
                g = edge.group
                out += gr.cut(edge, holding.regions[g], holding.data[g], request.seq_len)
        return out

    def place(self, request_id: str, piece: gr.Piece) -> None:
        """Land ``piece``; ``ValueError`` names what this rank does not hold of it."""
        holding = self.holdings[request_id]
        if piece.group not in holding.regions:
            raise ValueError(
                f"a piece of group {piece.group} from sender {piece.src}, which this receiver "
                "does not hold at all"
            )
        g = piece.group
        gr.place(piece, holding.regions[g], holding.data[g], holding.counts[g])

    def verdict(self, request_id: str) -> tuple[GroupVerdict, int]:
        """Every region of ``request_id`` against the oracles, and the bytes compared."""
        holding = self.holdings[request_id]
        total = nbytes = 0
        for g, region in holding.regions.items():
            problem = gr.check_region(
                self.model,
                region,
                holding.data[g],
                holding.counts[g],
                request_id,
                layout=self.layout,
                rank=self.who.rank,
                seed=self.config.seed,
            )
            if problem is not None:
                return GroupVerdict(False, problem, total, 1), nbytes
            total += sum(t.numel() for t in holding.data[g].values())
            nbytes += sum(t.numel() * t.element_size() for t in holding.data[g].values())
        return GroupVerdict(True, "", total, 0), nbytes
