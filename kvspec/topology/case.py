"""The transfer case: two stage layouts, a model, a replica policy and, where they
apply, the request's length and DP ranks [PLAN-6, DP-1]. It is what the strategies draw,
the checks hand an adapter and the golden vectors record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvspec.core.forms import build, read_form
from kvspec.topology.group_plan import GroupPlan, plan_groups
from kvspec.topology.model import ModelShape
from kvspec.topology.ownership import RankOwnership, rank_ownership
from kvspec.topology.plan import ReplicaRule, TransferPlan, plan_transfer
from kvspec.topology.stage import StageLayout


@dataclass(frozen=True)
class TransferCase:
    """One generated transfer: two stage layouts, the model, a replica policy and, where
    the stages split requests by tokens or serve them on attention-DP groups, the
    request's length and the DP ranks the router chose [PLAN-6, DP-1]."""

    source: StageLayout
    target: StageLayout
    model: ModelShape
    policy: str = "lowest"
    seq_len: int | None = None
    source_dp: int = 0
    target_dp: int = 0

    @property
    def sharded(self) -> bool:
        """Whether a side has token shards (the plan is for one request length) [PLAN-6]."""
        return self.source.token_shards > 1 or self.target.token_shards > 1

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, for counterexamples and golden vectors (the first release's
        keys, plus ``seq_len`` and the DP ranks where they apply)."""
        data: dict[str, Any] = {
            "source": self.source.to_dict(),
            "target": self.target.to_dict(),
            "model": self.model.to_dict(),
            "policy": self.policy,
        }
        if self.seq_len is not None:
            data["seq_len"] = self.seq_len
        if self.source.dp > 1 or self.target.dp > 1 or self.source_dp or self.target_dp:
            data.update(source_dp=self.source_dp, target_dp=self.target_dp)
        return data

    @classmethod
    def from_dict(cls, data: object) -> TransferCase:
        """Inverse of :meth:`to_dict`, also reading a case out of a record that holds its
        keys among others (a golden vector, a check's example); anything else is refused
        with :class:`~kvspec.core.errors.FormError`."""
        form = read_form(
            "TransferCase",
            data,
            required=("source", "target", "model"),
            optional=("policy", "seq_len", "source_dp", "target_dp"),
            others=True,
        )
        return build(
            "TransferCase",
            lambda: cls(
                StageLayout.from_dict(form["source"], where="TransferCase.source"),
                StageLayout.from_dict(form["target"], where="TransferCase.target"),
                ModelShape.from_dict(form["model"], where="TransferCase.model"),
                form.get("policy", "lowest"),
                form.get("seq_len"),
                form.get("source_dp", 0),
                form.get("target_dp", 0),
            ),
        )

    def plan(self, rule: ReplicaRule | None = None) -> TransferPlan:
        """The spec's plan; ``rule`` implements a policy that is not the spec's [PLAN-4]."""
        return plan_transfer(
            self.source,
            self.target,
            self.model,
            policy=self.policy,
            rule=rule,
            seq_len=self.seq_len,
            source_dp=self.source_dp,
            target_dp=self.target_dp,
        )

    def group_plan(
        self,
        seq_len: int,
        rule: ReplicaRule | None = None,
        *,
        model: ModelShape | None = None,
        **block_sizes: int,
    ) -> GroupPlan:
        """The spec's plan of every layer group for ``seq_len`` tokens [GROUP-3], its
        replicas chosen by the case's policy, or by ``rule`` where that policy is not the
        spec's [PLAN-4], as :meth:`plan`; ``model`` replaces the case's, ``block_sizes``
        are :func:`~kvspec.topology.group_plan.plan_groups`' ``block_size`` or
        ``source_block_size``/``target_block_size``."""
        return plan_groups(
            self.source,
            self.target,
            self.model if model is None else model,
            seq_len=seq_len,
            policy=self.policy,
            rule=rule,
            source_dp=self.source_dp,
            target_dp=self.target_dp,
            **block_sizes,
        )

    def owner(self, side: str, rank: int) -> RankOwnership:
        """What ``rank`` of the ``"source"`` or ``"target"`` side holds of this case's
        request: its heads, layers and (with token shards) tokens; nothing on another DP
        group [DP-1]."""
        layout = self.source if side == "source" else self.target
        dp_rank = self.source_dp if side == "source" else self.target_dp
        return rank_ownership(layout, self.model, rank, seq_len=self.seq_len, dp_rank=dp_rank)

    def describe(self) -> str:
        extra = "" if self.seq_len is None else f", {self.seq_len} tokens"
        if self.source.dp > 1 or self.target.dp > 1:
            extra += f", DP ranks {self.source_dp} -> {self.target_dp}"
        return (
            f"{self.source.describe()} -> {self.target.describe()}, {self.model.describe()}, "
            f"policy {self.policy}{extra}"
        )
