"""Test helper: several simulated hosts on one machine, each running torchrun for sim.node.

Two kinds of host: *loopback* hosts are addresses 127.a.b.1, 127.a.b.2, ... drawn at
random per test (so concurrent tests never share an address, and any port on them is
ours); *namespace* hosts are Linux network namespaces joined by a bridge, one address
each (root only; :func:`netns_unavailable` says why they cannot be made). Every process a
host's torchrun starts carries a mark in its environment, so that it, its workers and
their rank processes can be found and killed together; :meth:`Hosts.close` kills
whatever is left and removes every namespace, link and bridge it made, also when the
test failed.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sim.net.auth import KEY_ENV
from tests.paths import ROOT as REPO

TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def torchrun_command(
    nnodes: int, endpoint: str, run_id: str, flags: list[str], host: str, conf: str = ""
) -> list[str]:
    """docs/multihost.md's two-node command, for ``nnodes`` hosts: the same on every host but
    ``--host``, this host's own address (the one its senders bind and publish).
    ``conf`` adds rendezvous options (see :meth:`Hosts.start`)."""
    return [
        TORCHRUN,
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        "join_timeout=60" + conf,
        "--local-addr",
        host,
        "-m",
        "sim.node",
        *flags,
        "--host",
        host,
    ]


TOKEN = "KVSPEC_TEST_HOST"
"""An environment variable every process of a simulated host inherits: torchrun starts
its workers in sessions of their own, and orphans lose their parent, so a host's
processes are found by this mark, never by group or parentage."""


def _marked(mark: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            found.append(int(entry.name))
    return found


@dataclass
class Launched:
    """One host's torchrun; every process it starts carries its mark."""

    host: str
    process: subprocess.Popen[str]
    token: str

    @property
    def mark(self) -> bytes:
        return f"{TOKEN}={self.token}".encode()

    def members(self) -> list[int]:
        """Every process of this host still running (torchrun, its worker, rank processes)."""
        return _marked(self.mark)

    def sim_members(self) -> list[int]:
        """This host's sim processes (its sim.node worker and rank processes), torchrun aside."""
        found = []
        for pid in self.members():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"torchrun" not in cmdline:
                found.append(pid)
        return found

    def worker_env(self) -> dict[str, str] | None:
        """The environment torchrun gave this host's sim.node worker (None until it runs)."""
        for pid in self.members():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"sim.node" in cmdline and b"torchrun" not in cmdline:
                pairs = (item.decode(errors="replace").partition("=") for item in env if item)
                found = {k: v for k, _, v in pairs}
                if "RANK" in found:
                    return found
        return None

    def worker_rank(self) -> int | None:
        """The global rank of this host's sim.node worker, read from its environment."""
        env = self.worker_env()
        return None if env is None else int(env["RANK"])

    def kill(self) -> None:
        """Every process of this host at once, as when the machine dies."""
        for _ in range(3):  # a process forked meanwhile is caught by the next pass
            for pid in self.members():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@dataclass
class Hosts:
    """Simulated hosts; ``run`` starts one torchrun per host, ``close`` cleans everything."""

    addresses: list[str]
    wrap: list[list[str]]  # per host, the prefix that runs a command there
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    bridge: str | None = None
    launched: list[Launched] = field(default_factory=list)
    endpoint: str = ""
    run_id: str = ""
    watcher: subprocess.Popen[str] | None = None
    scratch: str | None = None
    """The TMPDIR every process of these hosts gets (torchrun's torchelastic_* folders, a
    killed worker's dump folder): removed by :meth:`close`, so a run leaves nothing."""

    def free_port(self) -> int:
        """A port free on the first host's address (namespaces start with every port free)."""
        if self.namespaces:
            return 29400
        with socket.socket() as probe:
            probe.bind((self.addresses[0], 0))
            return probe.getsockname()[1]

    def start(self, flags: list[str], *, per_host: list[list[str]] | None = None) -> None:
        """One torchrun per host with ``flags`` (plus that host's ``per_host`` flags)."""
        self.endpoint = endpoint = f"{self.addresses[0]}:{self.free_port()}"
        self.run_id = run_id = f"kvspec-{secrets.token_hex(4)}"
        self.key = secrets.token_hex(32)  # the run's key, given to every host out of band
        extra = per_host or [[] for _ in self.addresses]
        self.scratch = self.scratch or tempfile.mkdtemp(prefix="kvspec-hosts-")
        for i, (host, prefix, more) in enumerate(
            zip(self.addresses, self.wrap, extra, strict=True)
        ):
            # Say which host hosts the rendezvous store (the first); torchrun's guess
            # compares the endpoint with the machine's hostname, which on loopback
            # matches every host and in a namespace matches none.
            conf = f",is_host={str(i == 0).lower()}"
            command = prefix + torchrun_command(
                len(self.addresses), endpoint, run_id, [*flags, *more], host, conf
            )
            token = secrets.token_hex(6)
            process = subprocess.Popen(
                command,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
                env={
                    **os.environ,
                    "OMP_NUM_THREADS": "1",
                    "TMPDIR": self.scratch,
                    TOKEN: token,
                    KEY_ENV: self.key,
                },
            )
            self.launched.append(Launched(host, process, token))

    def watch(self) -> None:
        """Start a watcher of the run's phases (sim.net.rendezvous) on the first host (a
        namespace: inside it) now, so that its torch import overlaps torchrun's start-up
        and it polls the board long before traffic starts; :meth:`await_phase` reads it."""
        command = [*self.wrap[0], sys.executable, "-u", "-c", _WATCHER]
        self.watcher = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def first_worker_env(self, timeout: float) -> dict[str, str]:
        """The environment torchrun gave the first host's worker (its store address among
        it), once that worker runs; fails if it does not start within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            env = self.launched[0].worker_env()
            if env is not None:
                return env
            time.sleep(0.05)
        raise AssertionError("worker 0 never started")

    def await_phase(self, phase: str, timeout: float) -> None:
        """Wait until the run's coordinator publishes ``phase`` on its board in the
        workers' store. Fails, saying so, if the run got past ``phase`` first (a cut
        meant for mid-run would then land after it) or ended without reaching it."""
        assert self.watcher is not None, "call watch() right after start()"
        env = self.first_worker_env(timeout)
        # torchrun's workers share a store of their own, not the rendezvous endpoint's
        line = f"{env['MASTER_ADDR']} {env['MASTER_PORT']} {self.run_id} {phase} {timeout}\n"
        try:
            stdout, stderr = self.watcher.communicate(line, timeout=timeout + 10)
        except subprocess.TimeoutExpired:
            self.watcher.kill()
            stdout, stderr = self.watcher.communicate()
        if self.watcher.returncode != 0:  # say why: the hosts' own words, if they have ended
            ended = [
                f"host {i} exited {code}: {stderr_[-1500:]}"
                for i, (code, _, stderr_) in enumerate(self.wait(1.0))
                if code is not None
            ]
            pytest.fail(
                f"the run never reached {phase!r} (watcher: {stdout.strip()} {stderr[-800:]})\n"
                + "\n".join(ended)
            )

    def wait(self, timeout: float, *, skip: int | None = None) -> list[tuple[int | None, str, str]]:
        """(exit status, stdout, stderr) per host; status None if it outlived ``timeout``.
        Host ``skip`` is not waited for (its entry is None, "", "")."""
        end = time.monotonic() + timeout
        out: list[tuple[int | None, str, str]] = []
        for i, launched in enumerate(self.launched):
            if i == skip:
                out.append((None, "", ""))
                continue
            try:
                stdout, stderr = launched.process.communicate(
                    timeout=max(0.1, end - time.monotonic())
                )
                out.append((launched.process.returncode, stdout, stderr))
            except subprocess.TimeoutExpired:
                launched.kill()
                stdout, stderr = launched.process.communicate()
                out.append((None, stdout, stderr))
        return out

    def leftovers(self) -> list[int]:
        """Processes of any host's group still running (after ``wait``: none allowed)."""
        # a killed parent's children notice within 0.5 s on an idle host; the bound is for
        # a busy one (it returns as soon as none is left)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            left = [pid for launched in self.launched for pid in launched.members()]
            if not left:
                return []
            time.sleep(0.1)
        return left

    def cut(self, index: int) -> None:
        """Take host ``index`` off the network: its link down (namespaces) or, on
        loopback, where no link can be cut, the whole host killed at once."""
        if self.namespaces:
            _ip("link", "set", self.links[index], "down")
        else:
            self.launched[index].kill()

    def close(self) -> None:
        if self.watcher is not None and self.watcher.poll() is None:
            self.watcher.kill()
            self.watcher.communicate()
        for launched in self.launched:
            launched.kill()
            if launched.process.poll() is None:
                launched.process.wait(5)
        for namespace in self.namespaces:
            for pid in _netns_pids(namespace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], check=False, capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


_WATCHER = """
import sys, time, datetime, torch.distributed as d
h, p, run, phase, t = sys.stdin.readline().split()
end = time.monotonic() + float(t)
seen = ''
while time.monotonic() < end:
    try:
        s = d.TCPStore(h, int(p), is_master=False, timeout=datetime.timedelta(seconds=5))
        s = d.PrefixStore(f'kvspec-sim/{run}/0', s)
        while time.monotonic() < end:
            if s.check(['phase']):
                seen = s.get('phase').decode()
                if phase in seen:
                    sys.exit(0)
                if 'finish' in seen:
                    sys.exit(f'the run was already past {phase!r}: {seen}')
            time.sleep(0.05)
    except Exception as error:
        print('store:', error)
        time.sleep(0.2)
sys.exit(f'no {phase!r} within {t} s (last seen: {seen or "nothing"})')
"""
"""Polls the run's ``phase`` key; reads ``host port run phase timeout`` from stdin."""


def loopback_hosts(count: int) -> Hosts:
    """``count`` hosts at 127.a.b.1.. for a random a, b (Linux routes all of 127/8 to lo)."""
    a, b = random.randrange(2, 255), random.randrange(0, 255)
    return Hosts([f"127.{a}.{b}.{i + 1}" for i in range(count)], [[] for _ in range(count)])


def _ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(command)}: {done.stderr.strip()}")


def _netns_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if sys.platform != "linux":
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"kvspec-probe-{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def netns_hosts(count: int) -> Hosts:
    """``count`` namespaces on a fresh bridge, 10.a.b.1.. each; names unique to this call.

    Only addresses inside the namespaces are ever used; the bridge has no address, so
    no traffic leaves for the machine's own network. On any failure everything made so
    far is removed before the error is raised.
    """
    tag = secrets.token_hex(3)
    a, b = random.randrange(0, 255), random.randrange(0, 255)
    hosts = Hosts([], [], bridge=f"kvb{tag}")
    try:
        _ip("link", "add", hosts.bridge, "type", "bridge")
        _ip("link", "set", hosts.bridge, "up")
        for i in range(count):
            namespace, outside, inside = f"kvspec-{tag}-{i}", f"kvh{tag}{i}", f"kvn{tag}{i}"
            _ip("netns", "add", namespace)
            hosts.namespaces.append(namespace)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            hosts.links.append(outside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", hosts.bridge)
            _ip("link", "set", outside, "up")
            address = f"10.{a}.{b}.{i + 1}"
            _ip("addr", "add", f"{address}/24", "dev", inside, namespace=namespace)
            _ip("link", "set", inside, "up", namespace=namespace)
            _ip("link", "set", "lo", "up", namespace=namespace)
            hosts.addresses.append(address)
            hosts.wrap.append(["ip", "netns", "exec", namespace])
    except BaseException:
        hosts.close()
        raise
    return hosts
