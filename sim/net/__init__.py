"""How the ranks talk: the sim's own messages (:mod:`~sim.net.messages`), the run's secret
(:mod:`~sim.net.auth`), where each rank listens (:mod:`~sim.net.endpoints`), the largest
message each socket accepts (:mod:`~sim.net.sizing`), the tensor frames over
torch.distributed (:mod:`~sim.net.p2p`) and the torchrun workers' store
(:mod:`~sim.net.rendezvous`).

Above :mod:`sim.run` only."""
