"""What every kvspec and sim command shares: parsing arguments and refusing bad ones
(:mod:`~kvspec.console.args`), one-change hints (:mod:`~kvspec.console.nearby`), exits
(:mod:`~kvspec.console.exits`), JSON output (:mod:`~kvspec.console.output`), byte units
(:mod:`~kvspec.console.units`) and the stage and model options
(:mod:`~kvspec.console.stage_options`).

The ``kvspec`` command (:mod:`kvspec.cli`) and ``python -m sim`` both use it; the sim never
imports the command package."""
