"""Who may talk to whom in a run: a per-run secret and the messages signed with it.

Any process on the host can connect to a TCP port. So that a stranger can neither
read a receiver's KV nor stop a run, every run draws a fresh 256-bit secret and hands
it to its ranks when it starts them (as a process argument, never over a socket).
Then:

- a rank's first control message is a *hi* signed with the secret; the parent routes
  nothing to, and believes nothing from, a connection that has not said one;
- a receiver's *hello* to a sender is signed, with a fresh nonce; a sender sends KV
  only to the connections whose hello verified, one per receiver rank;
- the sender answers with a signed *welcome* over the same nonce, so the receiver
  knows it reached the real sender, not a program squatting on the port.

Signatures are HMAC-SHA256 over the run id, the message kind and the ranks involved;
anything that fails to verify is dropped and counted as a stranger, never fatal.
The data itself is not encrypted: the threat is a local stranger, and loopback
traffic cannot be read without root (see the threat model in docs/sim.md).

On several hosts (``sim.node``) the workers share no parent, and their meeting place,
torch.distributed's store, has no authentication. So the run's secret never travels:
every worker is given the run's *key* out of band (:func:`run_key`), and derives from it
the rank secret (:meth:`RunSecret.derive`) and the key that signs the store's values
(:func:`board_key`), each bound to the torchrun run.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass

KEY_ENV = "KVSPEC_SIM_KEY"
"""The environment variable that may carry a multi-host run's key (64 hex digits)."""
HOW_TO_KEY = (
    "give every host the same key out of band: a file only you can read "
    "(python -c 'import secrets; print(secrets.token_hex(32))' > key; chmod 600 key; "
    f"then --key-file key), or {KEY_ENV}=<64 hex digits> in the launcher's environment"
)


@dataclass(frozen=True)
class RunSecret:
    """The run's id and secret; ``hex`` round-trips it through a process argument."""

    run_id: str
    key: bytes

    @classmethod
    def new(cls) -> RunSecret:
        return cls(secrets.token_hex(8), secrets.token_bytes(32))

    @property
    def hex(self) -> str:
        return f"{self.run_id}:{self.key.hex()}"

    @classmethod
    def derive(cls, key: bytes, run: str) -> RunSecret:
        """Run ``run``'s rank secret from the run's key: the same on every host that holds
        the key, and nothing that could be read from the store."""
        run_id = _derive(key, "run id", run).hex()[:16]
        return cls(run_id, _derive(key, "rank secret", run))

    @classmethod
    def from_hex(cls, text: str) -> RunSecret:
        run_id, _, key = text.partition(":")
        return cls(run_id, bytes.fromhex(key))

    def sign(self, *fields: object) -> str:
        """The HMAC-SHA256, in hex, of this run's id and ``fields``."""
        message = "|".join([self.run_id, *map(str, fields)]).encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def verify(self, mac: object, *fields: object) -> bool:
        """Whether ``mac`` is :meth:`sign` of ``fields`` (constant-time; any type refused)."""
        return isinstance(mac, str) and hmac.compare_digest(mac, self.sign(*fields))


def new_nonce() -> str:
    return secrets.token_hex(8)


def _derive(key: bytes, purpose: str, run: str) -> bytes:
    return hmac.new(key, f"kvspec-sim {purpose} {run}".encode(), hashlib.sha256).digest()


def board_key(key: bytes, run: str) -> bytes:
    """The key that signs run ``run``'s values on the store (:mod:`sim.net.rendezvous`)."""
    return _derive(key, "board", run)


def run_key(path: str | None, environ: Mapping[str, str] = os.environ) -> bytes:
    """A multi-host run's key: from ``path`` (a regular file that only its owner may read
    or write, holding 64 hex digits) or else :data:`KEY_ENV`; ``ValueError`` saying what
    is wrong and how to give one otherwise. Never from a command line: that is readable by
    everyone on the host (``/proc/*/cmdline``)."""
    if path is not None:
        try:
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"--key-file {path} is not a regular file")
            if info.st_mode & 0o077:
                raise ValueError(
                    f"--key-file {path} is readable or writable by others (mode "
                    f"{stat.S_IMODE(info.st_mode):o}); chmod 600 {path}"
                )
            with open(path) as file:
                text = file.read(200).strip()
        except OSError as error:
            raise ValueError(f"--key-file {path}: {error.strerror}") from None
        return _parse_key(text, f"--key-file {path}")
    given = environ.get(KEY_ENV)
    if given is None:
        raise ValueError(f"a multi-host run needs a key: {HOW_TO_KEY}")
    return _parse_key(given.strip(), KEY_ENV)


def _parse_key(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f"{where} must hold 64 hex digits (a 256-bit key), got {len(text)} chars")
    return key
