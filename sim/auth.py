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
traffic cannot be read without root (see the README's threat model).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass


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
