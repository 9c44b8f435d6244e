"""Mutants of connector keys and ports [KEY-1..4, PORT-1..3]."""

from __future__ import annotations

from kvspec.conformance.mutants import mutant
from kvspec.conformance.reference import ReferenceAdapter
from kvspec.naming.keys import legacy_key, rank_aware_key
from kvspec.naming.ports import PortScheme, port, port_coords, raw_port
from kvspec.topology.stage import StageLayout


@mutant("KEY-1.1")
class RankFieldsSwapped(ReferenceAdapter):
    """Writes to_rank before from_rank (``{req}_{stage}_{chunk}_{to}_{from}``)."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        return super().rank_aware_key(request_id, from_stage, chunk_id, to_rank, from_rank)


@mutant("KEY-1.2")
class ZeroPaddedRanks(ReferenceAdapter):
    """Zero-pads the ranks to two digits so that keys sort ("_02_01")."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        key = super().rank_aware_key(request_id, from_stage, chunk_id, from_rank, to_rank)
        head = key[: -len(f"_{from_rank}_{to_rank}")]
        return f"{head}_{from_rank:02d}_{to_rank:02d}"


@mutant("KEY-2.1")
class LegacyStagesSwapped(ReferenceAdapter):
    """Writes the legacy key as omni_{to_stage}_to_{from_stage}_kv_cache_{request_id}."""

    def legacy_key(self, request_id, from_stage, to_stage):
        return super().legacy_key(request_id, to_stage, from_stage)


def _keys(case, request_id, ranks, *, legacy_if, from_stage, to_stage):
    """(key, peer) pairs: the legacy key when ``legacy_if``, else the spec's rank-aware key."""
    out = []
    for src, dst, peer in ranks:
        if legacy_if:
            key = legacy_key(request_id, from_stage, to_stage)
        else:
            key = rank_aware_key(request_id, from_stage, 0, src, dst)
        out.append((key, peer))
    return out


@mutant("KEY-2.2")
class LegacyKeyForTp1Pipelines(ReferenceAdapter):
    """Uses the legacy key whenever both stages are TP1, pipeline stages or not."""

    def send_keys(self, case, request_id, src, *, from_stage, to_stage):  # type: ignore[override]  # Adapter's keywords, not the reference's **stages
        single = case.source.tp == 1 and case.target.tp == 1
        edges = [(src, dst, dst) for dst in self.plan(case).targets_of(src)]
        return _keys(
            case, request_id, edges, legacy_if=single, from_stage=from_stage, to_stage=to_stage
        )

    def recv_keys(self, case, request_id, dst, *, from_stage, to_stage):  # type: ignore[override]  # Adapter's keywords, not the reference's **stages
        single = case.source.tp == 1 and case.target.tp == 1
        edges = [(src, dst, src) for src in self.plan(case).sources_of(dst)]
        return _keys(
            case, request_id, edges, legacy_if=single, from_stage=from_stage, to_stage=to_stage
        )


@mutant("KEY-3.1")
class EmptyRequestIdAccepted(ReferenceAdapter):
    """Builds keys of any string request id, the empty one and control characters included."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        if isinstance(request_id, str) and not (request_id and request_id.isprintable()):
            super().rank_aware_key("x", from_stage, chunk_id, from_rank, to_rank)
            return f"{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"
        return super().rank_aware_key(request_id, from_stage, chunk_id, from_rank, to_rank)

    def legacy_key(self, request_id, from_stage, to_stage):
        if isinstance(request_id, str) and not (request_id and request_id.isprintable()):
            super().legacy_key("x", from_stage, to_stage)
            return f"omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}"
        return super().legacy_key(request_id, from_stage, to_stage)


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


@mutant("KEY-3.2")
class FieldsCoercedWithInt(ReferenceAdapter):
    """Reads stage, chunk and ranks with ``int()``: "0_5" becomes 5, True 1, 1.0 1."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        fields = (_int(f) for f in (from_stage, chunk_id, from_rank, to_rank))
        return super().rank_aware_key(request_id, *fields)

    def legacy_key(self, request_id, from_stage, to_stage):
        return super().legacy_key(request_id, _int(from_stage), _int(to_stage))


@mutant("KEY-3.2")
class NegativeFieldsAccepted(ReferenceAdapter):
    """Formats any integer: a negative rank gives a key with a '-' in it."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        fields = (from_stage, chunk_id, from_rank, to_rank)
        if all(type(f) is int for f in fields) and min(fields) < 0:
            super().rank_aware_key(request_id, 0, 0, 0, 0)
            return f"{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"
        return super().rank_aware_key(request_id, *fields)

    def legacy_key(self, request_id, from_stage, to_stage):
        if type(from_stage) is int and type(to_stage) is int and min(from_stage, to_stage) < 0:
            return f"omni_{from_stage}_to_{to_stage}_kv_cache_{request_id}"
        return super().legacy_key(request_id, from_stage, to_stage)


@mutant("KEY-3.3")
class LegacyHeadNotRefused(ReferenceAdapter):
    """Builds rank-aware keys of any request id, one that begins with a legacy key's head
    included (its key then reads as a legacy key)."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        if isinstance(request_id, str) and request_id.startswith("omni_"):
            super().rank_aware_key("x", from_stage, chunk_id, from_rank, to_rank)
            return f"{request_id}_{from_stage}_{chunk_id}_{from_rank}_{to_rank}"
        return super().rank_aware_key(request_id, from_stage, chunk_id, from_rank, to_rank)


@mutant("KEY-3.4")
class TruncatesLongRequestIds(ReferenceAdapter):
    """Cuts request ids to 64 characters to fit a key-length limit of its store."""

    def rank_aware_key(self, request_id, from_stage, chunk_id, from_rank, to_rank):
        rid = request_id[:64] if isinstance(request_id, str) else request_id
        return super().rank_aware_key(rid, from_stage, chunk_id, from_rank, to_rank)

    def legacy_key(self, request_id, from_stage, to_stage):
        rid = request_id[:64] if isinstance(request_id, str) else request_id
        return super().legacy_key(rid, from_stage, to_stage)


@mutant("KEY-4.1")
class LegacyKeyWhenSenderIsTp1(ReferenceAdapter):
    """The sender uses the legacy key whenever its own TP is 1; the receiver does not."""

    def send_keys(self, case, request_id, src, *, from_stage, to_stage):  # type: ignore[override]  # Adapter's keywords, not the reference's **stages
        keys = super().send_keys(case, request_id, src, from_stage=from_stage, to_stage=to_stage)
        if case.source.tp == 1:
            legacy = super().legacy_key(request_id, from_stage, to_stage)
            return [(legacy, dst) for _, dst in keys]
        return keys


@mutant("KEY-4.2")
class KeyNamesSenderOnly(ReferenceAdapter):
    """Names a shipment by its sender alone ({req}_{stage}_{chunk}_{from_rank}), on both
    ends: two edges out of one sender share a key."""

    def send_keys(self, case, request_id, src, *, from_stage, to_stage):  # type: ignore[override]  # Adapter's keywords, not the reference's **stages
        keys = super().send_keys(case, request_id, src, from_stage=from_stage, to_stage=to_stage)
        return [(f"{request_id}_{from_stage}_0_{src}", dst) for _, dst in keys]

    def recv_keys(self, case, request_id, dst, *, from_stage, to_stage):  # type: ignore[override]  # Adapter's keywords, not the reference's **stages
        keys = super().recv_keys(case, request_id, dst, from_stage=from_stage, to_stage=to_stage)
        return [(f"{request_id}_{from_stage}_0_{src}", src) for _, src in keys]


@mutant("PORT-1.1")
class PortStridesSwapped(ReferenceAdapter):
    """Multiplies the stage by the rank stride instead of the rank (stage*16 + rank)."""

    def kv_port(self, base, stage, rank, replica):
        number = super().kv_port(base, stage, rank, replica)
        return number - rank * 16 - stage + stage * 16 + rank


@mutant("PORT-2.1")
class PortsWithoutDomain(ReferenceAdapter):
    """Applies the port formula to any stage and rank: stage 16 lands on the next rank's port."""

    def kv_port(self, base, stage, rank, replica):
        if isinstance(stage, int) and stage >= 16:
            super().kv_port(base, 0, rank, replica)
            return base + 100 + replica * 1024 + rank * 16 + stage
        return super().kv_port(base, stage, rank, replica)


@mutant("PORT-2.2")
class RankRangeUnchecked(ReferenceAdapter):
    """Checks the stage against the rank stride, not rank*16 + stage against the replica
    stride: rank 64 lands on the next replica's rank 0."""

    def kv_port(self, base, stage, rank, replica):
        if isinstance(rank, int) and isinstance(stage, int) and rank * 16 + stage >= 1024:
            super().kv_port(base, stage, 0, replica)
            return base + 100 + replica * 1024 + rank * 16 + stage
        return super().kv_port(base, stage, rank, replica)


@mutant("PORT-2.3")
class PortRangeUnchecked(ReferenceAdapter):
    """Never checks the result against 65535 (the OS refuses it at bind time, or wraps)."""

    def kv_port(self, base, stage, rank, replica):
        try:
            return super().kv_port(base, stage, rank, replica)
        except ValueError as error:
            if "65535" in str(error):
                return base + 100 + replica * 1024 + rank * 16 + stage
            raise


@mutant("PORT-2.4")
class NegativePortFieldsAccepted(ReferenceAdapter):
    """Checks upper bounds only: a negative stage, rank or replica gives some port."""

    def kv_port(self, base, stage, rank, replica):
        fields = (base, stage, rank, replica)
        if all(type(f) is int for f in fields) and min(fields) < 0:
            number = base + 100 + replica * 1024 + rank * 16 + stage
            if 1 <= number <= 65535 and stage < 16:
                return number
        return super().kv_port(base, stage, rank, replica)


@mutant("PORT-2.5")
class PortFieldsCoercedWithInt(ReferenceAdapter):
    """Reads the port fields with ``int()``: 3.0 and "3" pass."""

    def kv_port(self, base, stage, rank, replica):
        return super().kv_port(*(_int(f) for f in (base, stage, rank, replica)))


@mutant("PORT-2.6")
class DpSpanUnchecked(ReferenceAdapter):
    """Checks a rank against the replica stride but never a replica's span against the
    dp_stride: replica 4 under dp_stride 4096 binds DP rank 1's replica 0 ports."""

    def stage_port(self, base, stage, layout, rank, replica, scheme):
        if scheme.dp_stride is not None and isinstance(replica, int) and replica >= 0:
            dp_rank, local = port_coords(layout, rank, scheme)
            super().stage_port(base, stage, layout, rank, 0, scheme)  # the rest still checked
            return raw_port(scheme, "kv", base, stage, local, replica, dp_rank)
        return super().stage_port(base, stage, layout, rank, replica, scheme)


@mutant("PORT-3.1")
class NoReplicaTerm(ReferenceAdapter):
    """Uses the field's formula without a replica term: replicas of one host collide."""

    def kv_port(self, base, stage, rank, replica):
        super().kv_port(base, stage, rank, replica)
        return super().kv_port(base, stage, rank, 0)


@mutant("PORT-1.2")
class DpTermDropped(ReferenceAdapter):
    """Binds every rank at its stage-local rank, even under a scheme with a dp_stride."""

    def stage_port(
        self,
        base: int,
        stage: int,
        layout: StageLayout,
        rank: int,
        replica: int,
        scheme: PortScheme,
    ) -> int:
        return port("kv", base, stage, rank, replica, scheme=scheme)
