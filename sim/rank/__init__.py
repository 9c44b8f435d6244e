"""One rank: its event loop (:mod:`~sim.rank.loop`), the sender and receiver roles
(:mod:`~sim.rank.sender`, :mod:`~sim.rank.receiver`) and what they share
(:mod:`~sim.rank.context`).

Above every room but the harness."""
