"""``--transport nixl`` (and ``mooncake``, the same one-sided layer): every request's KV
moves one-sided through NIXL over UCX on DRAM, or the Mooncake transfer engine over
TCP [sim.paths.onesided, sim.paths.nixl, sim.paths.mooncake, DESC-1..3] — READs posted by receivers,
WRITEs by senders, each key's descriptor list one engine transfer, every element
verified against the oracle; the faults that mean something for a one-sided transfer;
the runs it refuses.

The runs need the engine (``pip install 'kvspec[nixl]'``, ``'kvspec[mooncake]'``) and are
skipped, with that reason, where it is absent; the refusals are checked everywhere."""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest

from kvspec.topology.model import ModelShape
from kvspec.topology.stage import StageLayout
from sim.books.report import SimReport
from sim.harness.cluster import run_simulation
from sim.harness.validation import exposure, validate
from sim.paths import mooncake
from sim.paths.onesided_checks import unloadable
from sim.run.config import ONE_SIDED_LIBRARIES, SimConfig
from sim.run.faults import parse_faults
from sim.run.workload import Workload
from tests.sim import runs


def engine(transport: str) -> object:
    """``transport`` as a parameter, skipped (naming how to install it) where its engine
    does not load."""
    module, install = ONE_SIDED_LIBRARIES[transport]
    why = unloadable(module)
    mark = pytest.mark.skipif(why is not None, reason=f"{module} {why} ({install})")
    return pytest.param(transport, marks=mark, id=transport)


ENGINES = [engine("nixl"), engine("mooncake")]
needs_nixl = pytest.mark.skipif(
    unloadable(ONE_SIDED_LIBRARIES["nixl"][0]) is not None,
    reason=f"NIXL does not load ({ONE_SIDED_LIBRARIES['nixl'][1]})",
)
GQA = ModelShape(2, 4, 16)
"""Two layers, four KV heads of 16: TP8 replicates each head on two ranks."""


def make(source_tp: int, transfer: str, transport: str = "nixl", **overrides) -> SimConfig:
    """A small one-sided run from TP``source_tp`` to TP2, over OS-assigned ports."""
    allowed = {"allow_unauthenticated_transport": transport == "mooncake"}
    return runs.small_run(
        (StageLayout(source_tp), StageLayout(2)),
        GQA,
        **{"transport": transport, "transfer": transfer, "requests": 3, **allowed, **overrides},
    )


def keys_of(config: SimConfig) -> int:
    """The keys the run moves: one per (request, chunk, plan edge) [KEY-4]."""
    workload = Workload(config, 0)
    book = workload.plans(0)
    return config.chunks * sum(len(book.of(r).edges) for r in workload.requests)


def elements_of(config: SimConfig) -> int:
    """Every element the receivers hold of the workload: K and V of every layer, head,
    dim and token (the receivers partition the heads)."""
    m = config.model
    tokens = sum(r.seq_len for r in Workload(config, 0).requests)
    return tokens * m.num_layers * m.kv_tensors * m.num_kv_heads * m.head_dim


def assert_moved_one_sided(report: SimReport) -> None:
    """Every request verified, every element of the workload checked, and every key one
    engine transfer whose descriptors carried exactly the plan's bytes."""
    runs.assert_all_verified(report)
    config = report.config
    assert report.elements_verified == elements_of(config)
    stats = report.receiver_stats
    assert stats["onesided_transfers"] == keys_of(config), stats
    assert stats["descriptor_bytes"] == report.bytes_moved
    assert stats["onesided_descriptors"] == stats["descriptors"] > 0
    assert stats["onesided_refused"] == stats["onesided_errors"] == 0
    # pull: each READ notifies its source; write: each WRITE notifies its receiver
    assert stats["onesided_notifications"] == keys_of(config)


@pytest.mark.parametrize("transport", ENGINES)
@pytest.mark.parametrize("transfer", ["pull", "write"])
@pytest.mark.parametrize("source_tp", [4, 8])
def test_tp_to_tp2_moves_every_key_one_sided(source_tp: int, transfer: str, transport: str) -> None:
    assert_moved_one_sided(run_simulation(make(source_tp, transfer, transport)))


LONG = 1024
"""Tokens in a request whose key lists outgrow Mooncake's queue for one peer: 4,096 rows
a key over :data:`GQA` (each token's head one run per layer and K/V at TP2), past the
1,024 it queues and the 1,024 more it lets wait (issue 46: every key failed, ``-1``)."""


def rows_per_key(report: SimReport) -> float:
    stats = report.receiver_stats
    return stats["onesided_descriptors"] / max(stats["onesided_transfers"], 1)


@pytest.mark.parametrize("transport", ENGINES)
@pytest.mark.parametrize("transfer", ["pull", "write"])
def test_key_lists_longer_than_the_engines_queue_move_whole(transfer: str, transport: str) -> None:
    """A key's list of 4,096 rows, four times what Mooncake's TCP transport queues for a
    peer: it goes in batches the queue holds and every element verifies; NIXL posts it
    as one transfer."""
    report = run_simulation(make(4, transfer, transport, requests=2, seq_len=(LONG, LONG)))
    assert_moved_one_sided(report)
    assert rows_per_key(report) > 2 * mooncake.QUEUE_DEFAULT, report.receiver_stats


@pytest.mark.parametrize("transfer", ["pull", "write"])
@pytest.mark.parametrize("transport", [t for t in ENGINES if t.id == "mooncake"])
def test_a_transfer_the_library_fails_is_booked_as_its_error_not_a_drop(
    monkeypatch, transfer: str, transport: str
) -> None:
    """Issue 46's failure, kept on purpose: each key's 4,096 rows in one Mooncake batch
    (no split to its queue), which its TCP transport refuses (-1). Each failed transfer is
    booked as Mooncake's error with its words and fails its request with them; nothing
    is booked as a fault (no drop observed that nobody injected), and the run fails."""
    monkeypatch.setattr(mooncake, "queue_depth", lambda: 1 << 30)  # the forked ranks too
    report = run_simulation(make(4, transfer, transport, requests=2, seq_len=(LONG, LONG)))
    failed = report.library_errors.get("Mooncake", [])
    assert failed and set(report.library_errors) == {"Mooncake"}, report.render()
    assert all("returned -1" in what for what in failed), failed
    assert report.fault_counts() == {} and not report.unbalanced_faults(), report.fault_counts()
    assert not report.ok and report.verified == 0, report.render()
    for outcome in report.outcomes:
        assert any("returned -1" in r for r in outcome.reasons), outcome
    assert f"library:    Mooncake failed {len(failed)} transfer(s)" in report.render()
    assert report.to_dict()["library_errors"] == {"Mooncake": failed}


def test_a_list_goes_to_mooncake_in_batches_its_queue_holds(monkeypatch) -> None:
    """:func:`sim.paths.mooncake.batch_transfer`: the rows in order, in batches of the queue's
    depth (``MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER`` where Mooncake takes the value, else
    1024); the first batch that fails ends it, named by its rows and status."""
    rows = np.array([[1000 + 10 * i, 10] for i in range(7)], dtype=np.int64)
    far = rows + np.array([5000, 0])
    posted: list[tuple[str, list[int], list[int], list[int]]] = []

    def move(peer: str, here: list[int], there: list[int], lengths: list[int]) -> int:
        posted.append((peer, here, there, lengths))
        return -1 if len(posted) == fail_at else 0

    def column(i: int) -> list[int]:
        return list(itertools.chain.from_iterable(p[i] for p in posted))

    monkeypatch.setenv(mooncake.QUEUE_VARIABLE, "3")
    fail_at = 0
    assert mooncake.batch_transfer(move, "127.0.0.1:9", rows, far) is None
    assert [len(p[1]) for p in posted] == [3, 3, 1]
    assert {p[0] for p in posted} == {"127.0.0.1:9"}
    assert (column(1), column(2)) == (rows[:, 0].tolist(), far[:, 0].tolist())
    assert column(3) == [10] * 7
    posted.clear()
    fail_at = 2
    failed = mooncake.batch_transfer(move, "127.0.0.1:9", rows, far, "READ")
    assert failed == "the Mooncake batch READ of rows 3..5 of 7 to 127.0.0.1:9 returned -1"
    assert len(posted) == 2  # the rest not posted
    for value, depth in [("", 1024), ("0", 1024), ("65536", 1024), ("x", 1024), (" +5", 5)]:
        monkeypatch.setenv(mooncake.QUEUE_VARIABLE, value)
        assert mooncake.queue_depth() == depth, value
    monkeypatch.delenv(mooncake.QUEUE_VARIABLE)
    assert mooncake.queue_depth() == mooncake.QUEUE_DEFAULT == 1024


@needs_nixl
def test_a_write_in_chunks_without_checksums() -> None:
    """Chunks are keys of their own; without checksums the oracle alone judges."""
    assert_moved_one_sided(
        run_simulation(make(4, "write", chunks=2, checksum=False, seq_len=(8, 24)))
    )


@pytest.mark.parametrize("transport", ENGINES)
def test_dropped_and_duplicated_notifications_are_booked_and_fail_only_their_request(
    transport: str,
) -> None:
    """A WRITE whose notification is dropped landed, but nobody was told: its request
    fails with the reason once the end-of-stream lists the key; a duplicated one is
    booked and never lands twice. Every fault is counted where injected and observed."""
    struck = set()
    for seed in range(3):
        report = run_simulation(
            make(
                4,
                "write",
                transport,
                requests=6,
                seed=seed,
                faults=parse_faults("drop=0.2,dup=0.2"),
            )
        )
        assert not report.unbalanced_faults(), (seed, report.fault_counts())
        dropped = report.fault_keys["injected"].get("drop", [])
        assert sorted(report.fault_keys["observed"].get("drop", [])) == sorted(dropped)
        failed = [o for o in report.outcomes if not o.ok]
        assert len(failed) == len({key.split("_")[0] for key in dropped}), seed
        for outcome in failed:
            assert any("never arrived intact" in r for r in outcome.reasons), outcome
        assert report.verified + len(failed) == len(report.outcomes)
        struck |= {k for k in ("drop", "dup") if report.fault_keys["injected"].get(k)}
    assert struck == {"drop", "dup"}, "the seeds strike both faults"


@pytest.mark.parametrize("transport", ENGINES)
def test_a_malformed_notification_is_refused_and_counted(transport: str) -> None:
    """``garbage=P`` sends a malformed notification before a WRITE's (through NIXL, or
    over the verified connection beside Mooncake): the receiver refuses it, books it by
    its edge, and every request still verifies."""
    report = run_simulation(
        make(4, "write", transport, requests=4, faults=parse_faults("garbage=0.5"))
    )
    runs.assert_all_verified(report)
    injected = report.fault_keys["injected"].get("garbage", [])
    assert injected and not report.unbalanced_faults(), report.fault_counts()
    if transport == "nixl":  # refused by the path itself, not by the ZMQ receiver
        assert report.receiver_stats["onesided_refused"] == len(injected)


@pytest.mark.parametrize("transport", ENGINES)
@pytest.mark.parametrize("transfer", ["pull", "write"])
def test_a_sender_dying_mid_transfer_is_reported_dead(transfer: str, transport: str) -> None:
    """A source killed half way through its keys is reported dead and every request ends
    verified or failed with its reason, none silently wrong. A writer dies before it has
    written the rest, so their requests fail; a pull's source is passive (it dies half
    way through the notifications of reads already posted), so what was read verifies."""
    report = run_simulation(
        make(4, transfer, transport, requests=6, faults=parse_faults("kill=sender:1@0.5"))
    )
    assert report.dead and not report.timed_out, report.render()
    assert not report.unbalanced_faults(), report.fault_counts()
    failed = [o for o in report.outcomes if not o.ok]
    assert all(o.reasons for o in failed)
    assert report.verified + len(failed) == len(report.outcomes)
    if transfer == "write":
        assert failed, report.render()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"transfer": "push"},
            r"--transport nixl with --transfer push: .*pull or --transfer write",
        ),
        ({"ranks_per_process": 2}, r"--transport nixl with --ranks-per-process 2"),
        ({"faults": parse_faults("corrupt=0.1")}, r"--transfer write with corrupt: .*drop=P"),
        ({"transfer": "pull", "faults": parse_faults("drop=0.1")}, r"--transfer pull with drop"),
        ({"faults": parse_faults("reorder=0.1")}, r"with reorder"),
        (
            {"host": "0.0.0.0"},
            r"--transport nixl with --host 0.0.0.0: its engine is held to loopback",
        ),
    ],
)
def test_what_nixl_refuses(overrides, message) -> None:
    settings = {"transfer": "write", **overrides}
    config = make(4, settings.pop("transfer"), **settings)
    with pytest.raises(ValueError, match=message):
        validate(config)


def test_three_stages_are_refused() -> None:
    config = runs.small_run(
        (StageLayout(4), StageLayout(2), StageLayout(1)), GQA, transport="nixl", transfer="pull"
    )
    with pytest.raises(ValueError, match=r"--transport nixl with 3 stages"):
        validate(config)


@pytest.mark.parametrize("transport", ["nixl", "mooncake"])
def test_without_the_engine_the_refusal_names_the_extra(monkeypatch, transport: str) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=rf"not installed: pip install 'kvspec\[{transport}\]'"):
        validate(make(4, "pull", transport))


def test_a_mooncake_run_says_its_engine_listens_on_every_interface() -> None:
    """Mooncake's engine binds 0.0.0.0, which the sim cannot change: the run says so."""
    assert exposure(make(4, "pull", "nixl")) is None
    assert "listens on every interface" in (exposure(make(4, "pull", "mooncake")) or "")


def assert_reuse_booked_and_caught(report: SimReport) -> None:
    """``reuse=P``: every request whose blocks a sender handed to another request before
    their transfer is done fails at the receivers' oracle naming the elements that differ
    [LIFE-3, ORACLE-5]; every other request verifies; each struck request is one fault on
    both books, however many senders struck it."""
    struck = set(report.fault_keys["injected"].get("reuse", []))
    assert struck, "the seed strikes at least one request"
    assert set(report.fault_keys["observed"].get("reuse", [])) == struck
    assert report.fault_counts()["reuse"] == {"injected": len(struck), "observed": len(struck)}
    assert not report.unbalanced_faults(), report.fault_counts()
    failed = {o.request_id for o in report.outcomes if not o.ok}
    assert failed == struck, report.render()
    for outcome in report.outcomes:
        if not outcome.ok:
            assert any("differ from the oracle" in r for r in outcome.reasons), outcome
    assert report.verified == len(report.outcomes) - len(struck)


@pytest.mark.parametrize("transport", ENGINES)
@pytest.mark.parametrize("transfer", ["pull", "write"])
def test_a_stale_descriptor_after_block_reuse_is_caught(transfer: str, transport: str) -> None:
    """The descriptors a reader or writer holds for a request stay valid addresses after
    its sender reuses the blocks early, so the engine moves whatever now lies there — the
    other request's KV — without an error: only the receiver's oracle can tell [LIFE-3]."""
    assert_reuse_booked_and_caught(
        run_simulation(make(4, transfer, transport, requests=6, faults=parse_faults("reuse=0.2")))
    )


def test_block_reuse_on_the_push_path_is_caught_too() -> None:
    """The same fault on push over ZMQ: the sender gathers the reused blocks and sends the
    other request's KV under this request's key; its CRC is of those bytes, so the codec
    accepts it and the oracle refuses it [WIRE-6, ORACLE-5]."""
    config = runs.small_run(
        (StageLayout(4), StageLayout(2)), GQA, requests=6, faults=parse_faults("reuse=0.2")
    )
    assert_reuse_booked_and_caught(run_simulation(config))


@pytest.mark.parametrize("other", ["drop=0.1", "corrupt=0.1", "abort=0.1", "kill=sender:1@0.5"])
def test_reuse_is_refused_beside_faults_that_fail_a_request_first(other: str) -> None:
    """A request failed for another reason is never verified, so its reused blocks would
    go unseen and the books could not balance: such pairs are refused, naming both."""
    faults = parse_faults(f"reuse=0.2,{other}")
    with pytest.raises(ValueError, match=rf"--faults reuse=0.2 with {other.split('=')[0]}"):
        runs.small_run((StageLayout(4), StageLayout(2)), GQA, faults=faults)


def refusal_of(config: SimConfig) -> str | None:
    """What :func:`validate` refuses ``config`` for, or None."""
    try:
        validate(config)
    except ValueError as error:
        return str(error)
    return None


def test_a_mooncake_run_is_refused_unless_an_unauthenticated_engine_is_allowed() -> None:
    """Mooncake's engine lets anyone who reaches its port read and write the ranks' caches
    (issue 45): a run over it needs the user's explicit flag; NIXL needs none (where NIXL
    is absent, the refusal is that, not authentication)."""
    with pytest.raises(
        ValueError,
        match=r"^--transport mooncake: the Mooncake transfer engine authenticates no peer .*"
        r"any local user included, can read and write every rank's registered cache.*"
        r"Pass --allow-unauthenticated-transport",
    ):
        validate(make(4, "write", "mooncake", allow_unauthenticated_transport=False))
    assert "authenticat" not in (refusal_of(make(4, "write", "nixl")) or "")


def test_require_loopback_refuses_mooncake_naming_the_interface() -> None:
    for allowed in (False, True):
        config = make(
            4, "pull", "mooncake", require_loopback=True, allow_unauthenticated_transport=allowed
        )
        with pytest.raises(
            ValueError,
            match=r"^--require-loopback with --transport mooncake: .*RPC port on 0\.0\.0\.0",
        ):
            validate(config)
    assert "loopback" not in (refusal_of(make(4, "pull", "nixl", require_loopback=True)) or "")


@pytest.mark.parametrize("transport", [t for t in ENGINES if t.id == "mooncake"])
def test_an_allowed_mooncake_run_says_so_in_its_first_line(transport: str) -> None:
    report = run_simulation(make(4, "write", transport, requests=1))
    runs.assert_all_verified(report)
    first = report.render().splitlines()[0]
    assert first.startswith(
        "UNAUTHENTICATED TRANSPORT (--allow-unauthenticated-transport): mooncake lets anyone"
    )
    nixl = make(4, "write", "nixl", allow_unauthenticated_transport=True)  # nothing to say
    assert SimReport(nixl, [], {}, {}, {}).render().startswith("kvspec sim: ")


def test_a_mooncake_engine_whose_port_was_taken_meanwhile_is_started_again() -> None:
    """The engine picks its own ports; another process can bind one between its pick and
    its bind (seen as 'bind: Address already in use' with parallel runs): a fresh engine
    is started, and any other error, or the same one every time, is raised."""
    starts: list[int] = []

    class Flaky:
        def __init__(self, taken: int, error: str = "bind: Address already in use") -> None:
            self.taken, self.error = taken, error

        def initialize(self, *args: str) -> int:
            starts.append(len(starts))
            if len(starts) <= self.taken:
                raise RuntimeError(self.error)
            return 0

    engine = mooncake._started(lambda: Flaky(taken=2))
    assert isinstance(engine, Flaky) and len(starts) == 3
    starts.clear()
    with pytest.raises(RuntimeError, match="Address already in use"):
        mooncake._started(lambda: Flaky(taken=mooncake.START_TRIES))
    assert len(starts) == mooncake.START_TRIES
    starts.clear()
    with pytest.raises(RuntimeError, match="no memory"):
        mooncake._started(lambda: Flaky(taken=1, error="no memory"))
    assert len(starts) == 1
