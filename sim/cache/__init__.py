"""A rank's memory: its paged cache and the oracle's verdict on it (:mod:`~sim.cache.memory`),
a hybrid's layer-group regions (:mod:`~sim.cache.groups`), a receiver's block pool under the
LIFE rules (:mod:`~sim.cache.pool`) and the host staging ring (:mod:`~sim.cache.staging`).

Above :mod:`sim.run` and :mod:`sim.net`; knows nothing of data paths or books."""
