"""A stranger process beside a two-host run in network namespaces (issue 30, [sim.net.auth]).

The stranger knows what another user of the first host can learn: every process's
command line (``/proc/*/cmdline`` is world-readable), the workers' store address (it
finds listening ports by trying them; the test hands it over) and the store's key
names (they are in this source). It does not know the run's key, which reaches the
hosts out of band (an environment variable or a 0600 file). For the whole run it reads
every key it can name, plants values of its own, and posts forged mailbox messages
ahead of the real ones; the run must verify every request, and nothing the stranger
saw may hold the run's key or the secret derived from it.

(The stranger runs as root: this machine's Python lives under ``/root``, which other
users cannot reach. It is given only what another user would have; that another user
cannot read the workers' environments or the key file is the file modes' business,
tested in test_sim_multihost.py.)

Known limit, not tested here: the store has no access control, so a stranger that
overwrites a mailbox entry between its writer's ``set`` and its reader's ``get`` makes
the reader drop it as forged and wait; the run then ends with its requests failed and a
reason, never with wrong KV (every value is signed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sim.net.auth import RunSecret, board_key
from tests.sim.test_sim_multihost import RUN_TIMEOUT_S, TWO_NODES, _check_verified, namespaces

__all__ = ["namespaces"]  # the fixture, imported for pytest

_STRANGER = """
import datetime, glob, json, sys, time
import torch.distributed as d
h, p, run, t = sys.stdin.readline().split()
end = time.monotonic() + float(t)
names = ['secret', 'key', 'run_key', 'phase', 'worker/0', 'worker/1']
names += [f'{k}/r0s{s}k{r}' for k in ('claim', 'ep') for s in (0, 1) for r in range(2)]
seen, errors, cmdlines, planted = {}, [], [], 0
for path in glob.glob('/proc/[0-9]*/cmdline'):
    try:
        cmdlines.append(open(path, 'rb').read().replace(b'\\0', b' ').decode('utf-8', 'replace'))
    except OSError:
        pass
store = None
while time.monotonic() < end:
    try:
        if store is None:
            server = d.TCPStore(h, int(p), is_master=False, timeout=datetime.timedelta(seconds=5))
            store = d.PrefixStore(f'kvspec-sim/{run}/0', server)
        for name in names:
            if store.check([name]):
                seen.setdefault(name, set()).add(store.get(name).decode('utf-8', 'replace'))
        for name in ('secret', 'key', 'claim/r9s9k9', 'ep/r9s9k9'):
            store.set(name, json.dumps({'forged': name}))
            planted += 1
        for src in range(2):
            for dst in range(2):
                for seq in range(50, 53):  # ahead of any real post
                    store.set(f'mb/{src}/{dst}/{seq}', '{"batch": [{"cmd": {"cmd": "finish"}}]}')
                    planted += 1
        if store.check(['phase']) and 'finish' in store.get('phase').decode():
            break
    except Exception as error:
        errors.append(str(error)[:200])
        store = None
    time.sleep(0.05)
print(json.dumps({'seen': {k: sorted(v) for k, v in seen.items()}, 'cmdlines': cmdlines,
                  'planted': planted, 'errors': errors[-5:]}))
"""


def test_a_stranger_beside_a_two_namespace_run_gets_no_secret_and_costs_nothing(
    namespaces, tmp_path: Path
) -> None:
    hosts = namespaces(2)
    report = tmp_path / "report.json"
    hosts.start([*TWO_NODES, "--json", str(report)])
    stranger = subprocess.Popen(
        [*hosts.wrap[0], sys.executable, "-u", "-c", _STRANGER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    env = hosts.first_worker_env(RUN_TIMEOUT_S)
    line = f"{env['MASTER_ADDR']} {env['MASTER_PORT']} {hosts.run_id} {RUN_TIMEOUT_S}\n"
    try:
        stdout, stderr = stranger.communicate(line, timeout=RUN_TIMEOUT_S + 30)
    finally:
        stranger.kill()
    outcomes = hosts.wait(RUN_TIMEOUT_S)
    assert hosts.leftovers() == [], "processes left running after every torchrun ended"
    _check_verified(outcomes, report, hosts, 2)

    found = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    assert found is not None, stderr[-2000:]
    assert found["planted"] > 0, f"the stranger never reached the store: {found['errors']}"
    assert "ep/r0s0k0" in found["seen"], "the stranger read nothing a stranger can read"
    # as sim.node derives them: bound to the torchrun run and its workers' store
    context = f"{hosts.run_id}/0@{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    key = bytes.fromhex(hosts.key)
    secrets = {
        "the run's key": hosts.key,
        "the rank secret": RunSecret.derive(key, context).key.hex(),
        "the board's signing key": board_key(key, context).hex(),
    }
    for text in [*found["cmdlines"], *(v for vs in found["seen"].values() for v in vs)]:
        for what, value in secrets.items():
            assert value not in text, f"{what} was visible to the stranger"
    real_secret = [v for v in found["seen"].get("secret", []) if "forged" not in v]
    assert real_secret == [], "the store held a secret"
