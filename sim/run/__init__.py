"""What a run is, as plain data every rank derives alike: its configuration
(:mod:`~sim.run.config`), its faults (:mod:`~sim.run.faults`) and its workload, the
requests and where each rank keeps them (:mod:`~sim.run.workload`).

The bottom room: it imports no other part of the sim."""
