"""The parent of a run: validating it before anything starts (:mod:`~sim.harness.validation`),
starting and watching its ranks (:mod:`~sim.harness.cluster`, :mod:`~sim.harness.hosts`),
across hosts under torchrun (:mod:`~sim.harness.multihost`), the live progress line
(:mod:`~sim.harness.progress`) and the process's start (:mod:`~sim.harness.clock`).

The top room; only the commands (:mod:`sim.cli`, :mod:`sim.node`, ``python -m sim``) sit
above it."""
