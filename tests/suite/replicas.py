"""A replicated-heads case and an adapter whose every replica sends (SGLang's choice),
shared by the tier tests [PLAN-2.2]."""

from kvspec.conformance.reference import ReferenceAdapter
from kvspec.topology.case import TransferCase
from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout

REPLICATED = TransferCase(StageLayout(4), StageLayout(2), ModelShape(2, 2, 2)).to_dict()
"""TP4 -> TP2 with 2 heads: each head on two source replicas (ranks 0, 1 hold head 0)."""


def holders(case, dst):
    """Every source rank holding some of receiver ``dst``'s heads and layers."""
    receiver = case.owner("target", dst)
    return [
        src
        for src in case.source.ranks()
        if set(case.owner("source", src).heads) & set(receiver.heads)
        and set(case.owner("source", src).layers) & set(receiver.layers)
    ]


class EveryReplicaSends(ReferenceAdapter):
    """SGLang's choice: every replica of a replicated head sends it (identical bytes) and
    the receiver counts them; declared as replicas_write='every'."""

    replicas_write = "every"

    def sources(self, case, dst):
        return holders(case, dst)
