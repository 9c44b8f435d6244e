"""The sim across hosts under torchrun (sim.node): one machine as several hosts.

Loopback hosts (127.a.b.x) always run; network-namespace hosts run as root where
namespaces can be made, and are skipped with the reason elsewhere. Every run verifies
every element; a cut host ends each request verified or failed with a reason; nothing
is left running and every namespace is removed, also when a test fails.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from sim.net import messages, rendezvous
from sim.net.auth import KEY_ENV, RunSecret, run_key
from sim.net.rendezvous import Board, BoardError, config_digest
from tests.sim.multihost import (
    REPO,
    Hosts,
    loopback_hosts,
    netns_hosts,
    netns_unavailable,
    torchrun_command,
)

SMALL = ["--kv-heads", "4", "--layers", "2", "--head-dim", "16", "--seq-len", "16:48", "--quiet"]
THREE_HOSTS = ["--source-tp", "4", "--target-tp", "2", "--requests", "3", *SMALL]
RUN_TIMEOUT_S = 240.0
CUT_DELAY = "delay=3s"
"""The link-cut runs' pace: 12 messages per sender at 3 s each, so a cut one second after
*go* lands mid-run even when a loaded machine is slow to see *go*; the survivors end
within the heartbeat limit of the cut, so the long tail is never waited for."""


@pytest.fixture
def loopback() -> Iterator[Callable[[int], Hosts]]:
    made: list[Hosts] = []

    def make(count: int) -> Hosts:
        made.append(loopback_hosts(count))
        return made[-1]

    yield make
    for hosts in made:
        hosts.close()


@pytest.fixture
def namespaces() -> Iterator[Callable[[int], Hosts]]:
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    made: list[Hosts] = []

    def make(count: int) -> Hosts:
        made.append(netns_hosts(count))
        return made[-1]

    yield make
    for hosts in made:
        hosts.close()


def _run(hosts: Hosts, flags: list[str], report: Path) -> list[tuple[int | None, str, str]]:
    hosts.start([*flags, "--json", str(report)])
    results = hosts.wait(RUN_TIMEOUT_S)
    assert hosts.leftovers() == [], "processes left running after every torchrun ended"
    return results


def _check_verified(results, report: Path, hosts: Hosts, requests: int) -> None:
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["ok"] and data["requests"] == {"total": requests, "verified": requests, "failed": 0}
    assert sorted(h["host"] for h in data["hosts"]) == sorted(hosts.addresses)
    assert all(e["bytes"] == e["planned_bytes"] for e in data["edges"])


def test_three_loopback_hosts_tp4_over_two_to_tp2(loopback, tmp_path: Path) -> None:
    """TP4 on two hosts -> TP2 on a third, on the spec's ports [PORT-3 per host]."""
    hosts = loopback(3)
    results = _run(hosts, THREE_HOSTS, tmp_path / "report.json")
    _check_verified(results, tmp_path / "report.json", hosts, 3)
    data = json.loads((tmp_path / "report.json").read_text())
    assert [len(h["ranks"]) for h in data["hosts"]] == [2, 2, 2]


def test_three_loopback_hosts_with_tensor_frames_over_gloo(loopback, tmp_path: Path) -> None:
    """The same run with ``--transport gloo``: headers on ZMQ, every tensor frame over
    torch.distributed send/recv between the hosts' rank processes [sim.net.p2p]."""
    hosts = loopback(3)
    report = tmp_path / "gloo.json"
    results = _run(hosts, [*THREE_HOSTS, "--transport", "gloo"], report)
    _check_verified(results, report, hosts, 3)
    data = json.loads(report.read_text())
    assert data["config"]["transport"] == "gloo"


def test_a_cut_loopback_host_fails_its_requests_with_reasons(loopback, tmp_path: Path) -> None:
    """A host killed mid-run: every request verified or failed with its reason; the
    survivors notice by the heartbeat, end, and leave nothing running."""
    hosts = loopback(3)
    flags = ["--source-tp", "4", "--target-tp", "2", "--requests", "12", *SMALL]
    hosts.start([*flags, "--faults", CUT_DELAY, "--json", str(tmp_path / "r.json")])
    hosts.watch()
    victim = _non_coordinator(hosts)
    hosts.await_phase("go", RUN_TIMEOUT_S)
    time.sleep(1.0)  # mid-run: each sender spends 36 s on its 12 delayed messages
    hosts.cut(victim)
    results = hosts.wait(RUN_TIMEOUT_S)  # noticed by heartbeat (asserted below), not timed
    assert hosts.leftovers() == []
    for i, (code, _, stderr) in enumerate(results):
        if i != victim:
            assert code == 1, stderr[-3000:]  # the run failed requests: every worker says so
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["requests"]["total"] == 12 and data["requests"]["failed"] >= 1
    for failure in data["failures"]:
        assert failure["reasons"], failure
    lost = [h for h in data["hosts"] if h["lost"]]
    assert [h["host"] for h in lost] == [hosts.addresses[victim]]
    assert all("died" in r for f in data["failures"] for r in f["reasons"]), data["failures"]
    victims = lost[0]["ranks"]  # tags r0s<stage>k<rank>
    assert sorted(d.split(":")[0] for d in data["dead_ranks"]) == sorted(
        f"replica 0 stage {t[3]} rank {t[5]}" for t in victims
    )
    assert all("was lost (no heartbeat" in d for d in data["dead_ranks"]), data["dead_ranks"]


def test_mismatched_configurations_are_refused_naming_both(loopback) -> None:
    """Two hosts launched with different --requests: both refuse, naming both workers."""
    hosts = loopback(2)
    base = ["--source-tp", "2", "--target-tp", "2", *SMALL]
    hosts.start(base, per_host=[["--requests", "2"], ["--requests", "3"]])
    results = hosts.wait(RUN_TIMEOUT_S)
    assert hosts.leftovers() == []
    assert all(code not in (0, None) for code, _, _ in results)
    text = "".join(stderr for _, _, stderr in results)
    assert "mismatched configurations: worker 0 on 127." in text, text[-3000:]
    assert "requests (2 vs 3)" in text or "requests (3 vs 2)" in text, text[-3000:]


def _non_coordinator(hosts: Hosts) -> int:
    """A host to cut: neither the coordinator's (worker 0) nor the first, which hosts
    torchrun's rendezvous store (losing it ends the whole job in torchrun itself)."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        ranks = [launched.worker_rank() for launched in hosts.launched]
        if None not in ranks:
            return next(i for i in range(1, len(ranks)) if ranks[i] != 0)
        time.sleep(0.2)
    raise AssertionError("the sim.node workers never started")


TWO_NODES = ["--source-tp", "2", "--target-tp", "2", "--requests", "2", *SMALL]
"""The flags of docs/multihost.md's two-node command (its ``--json`` and ``--host`` aside)."""


def test_the_documented_two_node_command_is_the_one_the_namespace_test_runs() -> None:
    text = (REPO / "docs" / "multihost.md").read_text()
    block = text[
        text.index("```bash\n# on node 0") + 8 : text.index("```", text.index("# on node 1"))
    ]
    commands = [
        shlex.split(part.replace("\\\n", " "), comments=True)
        for part in block.split("# on node ")[1:]
    ]
    for node, command in enumerate(commands):
        expected = torchrun_command(
            2,
            "10.0.0.1:29400",
            "kvspec-run",
            [*TWO_NODES, "--json", "report.json", "--key-file", "sim-key"],
            f"10.0.0.{node + 1}",
            f",is_host={str(node == 0).lower()}",
        )
        assert command[1:] == ["torchrun", *expected[1:]], f"node {node}"


@pytest.mark.parametrize("transport", ["tcp", "gloo"])
def test_two_namespace_hosts(namespaces, tmp_path: Path, transport: str) -> None:
    """docs/multihost.md's two-node command, each node a network namespace with its own address;
    with gloo, the tensor frames cross the bridge over torch.distributed [sim.net.p2p]."""
    hosts = namespaces(2)
    results = _run(hosts, [*TWO_NODES, "--transport", transport], tmp_path / "report.json")
    _check_verified(results, tmp_path / "report.json", hosts, 2)


def test_three_namespace_hosts_with_a_link_cut(namespaces, tmp_path: Path) -> None:
    """TP4 over two namespaces -> TP2 on a third, one agent's link cut mid-run: every
    request ends verified or failed with a reason, the survivors end at once, and the
    cut-off host's sim ends too. (Full verification across three hosts: the loopback
    test; across namespaces: the two-host test. Both kept small for the suite's time.)"""
    hosts = namespaces(3)
    flags = ["--source-tp", "4", "--target-tp", "2", "--requests", "12", *SMALL]
    hosts.start([*flags, "--faults", CUT_DELAY, "--json", str(tmp_path / "cut.json")])
    hosts.watch()
    victim = _non_coordinator(hosts)
    hosts.await_phase("go", RUN_TIMEOUT_S)
    time.sleep(1.0)
    hosts.cut(victim)
    results = hosts.wait(RUN_TIMEOUT_S, skip=victim)
    assert all(code == 1 for i, (code, _, _) in enumerate(results) if i != victim), results
    # Cut off, the victim's worker loses the store within its timeout and stops its ranks.
    # (Its torchrun agent retries the unreachable rendezvous on torchrun's own schedule;
    # that is torchrun's, not the sim's, and is killed when the test cleans up.)
    end = time.monotonic() + 60
    while hosts.launched[victim].sim_members() and time.monotonic() < end:
        time.sleep(0.2)
    assert hosts.launched[victim].sim_members() == [], "the cut host's sim kept running"
    hosts.launched[victim].kill()
    assert hosts.leftovers() == []
    data = json.loads((tmp_path / "cut.json").read_text())
    assert data["requests"]["failed"] >= 1
    for failure in data["failures"]:
        assert failure["reasons"], failure
    assert [h["host"] for h in data["hosts"] if h["lost"]] == [hosts.addresses[victim]]


# -- the board, against a real TCPStore on an OS-assigned port ---------------------------
KEY = bytes(range(32))
ENDPOINT = "tcp://127.0.0.1:0"
"""A value to publish on the board; nothing binds it."""


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    yield server


def test_board_refuses_mismatched_configurations_naming_both(store) -> None:
    a, b = Board(store, 0, 2, "t", key=KEY), Board(store, 1, 2, "t", key=KEY)
    a.put(
        "worker/0",
        {"host": "h0", "digest": config_digest({"requests": 2}), "config": {"requests": 2}},
    )
    with pytest.raises(BoardError, match=r"worker 0 on h0 .* worker 1 on h1 .*requests \(2 vs 3\)"):
        b.join("h1", {"requests": 3}, time.monotonic() + 60)


def test_board_join_times_out_naming_the_missing_worker(store, monkeypatch) -> None:
    board = Board(store, 0, 3, "t", key=KEY)
    polls = []

    def sleep(seconds: float) -> None:  # a clock of our own: each poll moves it on
        polls.append(seconds)
        clock[0] += seconds

    clock = [time.monotonic()]
    monkeypatch.setattr(rendezvous.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(rendezvous.time, "sleep", sleep)
    deadline = clock[0] + 0.5
    with pytest.raises(BoardError, match=r"within 0\.5 s .*worker/1, worker/2"):
        board.join("h0", {"requests": 2}, deadline)
    assert deadline < clock[0] <= deadline + max(polls)  # at the first poll past it


def test_board_refuses_a_rank_claimed_twice(store) -> None:
    Board(store, 0, 2, "t", key=KEY).claim(["r0s0k0"], "h0")
    with pytest.raises(
        BoardError, match="r0s0k0 is claimed twice: by worker 0 on h0 and by worker 1 on h1"
    ):
        Board(store, 1, 2, "t", key=KEY).claim(["r0s0k0"], "h1")


def test_board_mailboxes_keep_order_and_delete_what_was_read(store) -> None:
    a, b = Board(store, 0, 2, "t", key=KEY), Board(store, 1, 2, "t", key=KEY)
    a.post(1, [{"n": 1}, {"n": 2}])
    a.post(1, [{"n": 3}])
    assert b.receive([0]) == [(0, {"n": 1}), (0, {"n": 2}), (0, {"n": 3})]
    assert b.receive([0]) == []
    assert not b.has("mb/0/1/0")


def test_board_notices_a_silent_worker(store) -> None:
    a, b = Board(store, 0, 2, "t", key=KEY), Board(store, 1, 2, "t", key=KEY)
    a.start_beating()
    try:
        assert b.silent_for(0) == 0.0
        time.sleep(1.2)
        assert b.silent_for(0) == 0.0  # it moved
        a.stop_beating()
        time.sleep(0.1)
        b.silent_for(0)
        time.sleep(1.2)
        assert b.silent_for(0) >= 1.0
    finally:
        a.stop_beating()


def _stranger(store) -> dist.PrefixStore:
    """What another user on the host gets: the store's port, and the key names (they are
    in this source), but not the run's key."""
    return dist.PrefixStore(f"{rendezvous.PREFIX}/t", store)


def test_nothing_secret_rests_in_the_store(store) -> None:
    """The rank secret is derived on every host from the key; the store never holds it."""
    a, b = Board(store, 0, 2, "t", key=KEY), Board(store, 1, 2, "t", key=KEY)
    a.put("worker/0", {"host": "h0", "digest": "d", "config": {}})
    a.claim(["r0s0k0"], "h0")
    a.publish_endpoint("r0s0k0", ENDPOINT)
    a.post(1, [{"event": "x"}])
    secret = RunSecret.derive(KEY, "t")
    stranger = _stranger(store)
    assert not stranger.check(["secret"])
    for name in ("worker/0", "claim/r0s0k0", "ep/r0s0k0", "mb/0/1/0"):
        value = stranger.get(name).decode()
        assert secret.key.hex() not in value and KEY.hex() not in value, name
    assert b.receive([0]) == [(0, {"event": "x"})]


@pytest.mark.parametrize(
    ("forge", "named"),
    [
        (lambda name, value: messages.dump(value), "is not signed"),
        (
            lambda name, value: _other_board()._signed(name, value),
            "is not signed with this run's key",
        ),
    ],
    ids=["unsigned", "another key"],
)
def test_a_worker_record_a_stranger_writes_is_refused(store, forge, named) -> None:
    """A stranger's record for worker 1 (to join in its place) stops the run, naming the key."""
    a = Board(store, 0, 2, "t", key=KEY)
    _stranger(store).set(
        "worker/1", forge("worker/1", {"host": "evil", "digest": "d", "config": {}})
    )
    with pytest.raises(BoardError, match=f"worker/1 on the board {named}"):
        a.join("h0", {"requests": 2}, time.monotonic() + 60)


def _other_board() -> Board:
    board = Board.__new__(Board)
    board.prefix, board.key = f"{rendezvous.PREFIX}/t", bytes(32)
    return board


def test_a_rank_a_stranger_claims_first_is_refused_naming_it(store) -> None:
    _stranger(store).set("claim/r0s0k0", "worker 0 on evil")
    with pytest.raises(BoardError, match="claim/r0s0k0 on the board is not"):
        Board(store, 0, 2, "t", key=KEY).claim(["r0s0k0"], "h0")


def test_a_message_a_stranger_posts_is_dropped_and_the_real_one_read(store) -> None:
    a, b = Board(store, 0, 2, "t", key=KEY), Board(store, 1, 2, "t", key=KEY)
    _stranger(store).set("mb/0/1/0", messages.dump({"batch": [{"cmd": {"cmd": "finish"}}]}))
    assert b.receive([0]) == [] and b.forged == 1
    a.post(1, [{"n": 1}])  # the writer's own batch for that slot still arrives
    assert b.receive([0]) == [(0, {"n": 1})]


def test_a_signed_value_moved_to_another_name_is_refused(store) -> None:
    """The MAC covers the name: an endpoint published for one rank cannot be replayed as
    another's, nor an old mailbox batch into a new slot."""
    a = Board(store, 0, 2, "t", key=KEY)
    a.publish_endpoint("r0s0k0", ENDPOINT)
    stranger = _stranger(store)
    stranger.set("ep/r0s0k1", stranger.get("ep/r0s0k0"))
    with pytest.raises(BoardError, match="ep/r0s0k1 on the board is not signed with"):
        a.endpoints(["r0s0k1"])


def test_the_run_key_comes_only_from_a_private_file_or_the_environment(tmp_path) -> None:
    key_file = tmp_path / "sim-key"
    key_file.write_text(KEY.hex() + "\n")
    key_file.chmod(0o600)
    assert run_key(str(key_file), environ={}) == KEY
    assert run_key(None, environ={KEY_ENV: KEY.hex()}) == KEY
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match=r"readable or writable by others \(mode 644\)"):
        run_key(str(key_file), environ={})
    with pytest.raises(ValueError, match=r"a multi-host run needs a key: .*chmod 600"):
        run_key(None, environ={})
    with pytest.raises(ValueError, match="KVSPEC_SIM_KEY must hold 64 hex digits"):
        run_key(None, environ={KEY_ENV: "abc"})
    with pytest.raises(ValueError, match="No such file"):
        run_key(str(tmp_path / "missing"), environ={})


def test_the_rank_secret_is_bound_to_the_key_and_the_run() -> None:
    one = RunSecret.derive(KEY, "run/0@10.0.0.1:1234")
    assert one == RunSecret.derive(KEY, "run/0@10.0.0.1:1234")  # every host agrees
    assert one != RunSecret.derive(KEY, "run/0@10.0.0.1:1235")  # another run's store
    assert one != RunSecret.derive(bytes(32), "run/0@10.0.0.1:1234")


def test_sim_node_outside_torchrun_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sim.node", "--quiet"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")},
        timeout=120,
    )
    assert done.returncode == 2
    assert "run me under torchrun" in done.stderr and done.stderr.count("\n") == 1


# -- shares and the per-host port proof ---------------------------------------------------
def _config(**changes):
    from kvspec.topology.model import ModelShape
    from kvspec.topology.stage import StageLayout
    from sim.run.config import SimConfig

    model = ModelShape(num_layers=2, num_kv_heads=4, head_dim=16)
    return SimConfig(stages=(StageLayout(4), StageLayout(2)), model=model, **changes)


def test_shares_are_contiguous_and_cover_every_rank_once() -> None:
    from sim.harness.multihost import shares
    from sim.net.endpoints import all_ranks

    ranks = all_ranks(_config())
    three = shares(ranks, 3)
    assert [[r.tag for r in s] for s in three] == [
        ["r0s0k0", "r0s0k1"],
        ["r0s0k2", "r0s0k3"],
        ["r0s1k0", "r0s1k1"],
    ]
    assert [r for s in shares(ranks, 4) for r in s] == ranks
    with pytest.raises(ValueError, match="7 torchrun workers but the run has only 6 ranks"):
        shares(ranks, 7)


def test_the_port_proof_is_per_host_and_names_a_taken_port() -> None:
    import socket

    from kvspec.naming.ports import port
    from sim.harness.multihost import shares
    from sim.net.endpoints import all_ranks
    from sim.node import check_host_ports

    with socket.socket() as probe:  # a base whose first sender port we hold ourselves
        probe.bind(("127.0.0.1", 0))
        held = probe.getsockname()[1]
        probe.listen()
        config = _config(base_port=held - 100, host="127.0.0.1")
        assert port("kv", config.base_port, 0, 0, 0) == held
        share = shares(all_ranks(config), 2)
        with pytest.raises(ValueError, match=f"port {held} for replica 0 stage 0 rank 0 is taken"):
            check_host_ports(config, share, ["127.0.0.1", "127.0.0.2"], 0)
        check_host_ports(config, share, ["127.0.0.1", "127.0.0.2"], 1)  # not on its host
