"""The data paths: the one interface (:mod:`~sim.paths.datapath`) and the paths behind it,
``--transfer push|pull|write`` (:mod:`~sim.paths.push`, :mod:`~sim.paths.pull`,
:mod:`~sim.paths.write`, sharing :mod:`~sim.paths.regions` and :mod:`~sim.paths.byteruns`),
a hybrid's layer groups pushed or pulled (:mod:`~sim.paths.groups`, framed by
:mod:`~sim.paths.pieces`) and the one-sided transports (:mod:`~sim.paths.onesided`,
:mod:`~sim.paths.nixl`, :mod:`~sim.paths.mooncake`, refused up front by
:mod:`~sim.paths.onesided_checks`).

Above run, net, cache and books; a path never imports a rank's roles (:mod:`sim.rank`)."""
