"""kvspec: the executable reference for moving a KV cache between parallel layouts.

Start with :mod:`kvspec.topology.plan` (who sends what to whom) and :mod:`kvspec.core.clauses`
(every rule, by id). ``kvspec --help`` lists the commands.
"""

__version__ = "0.1.0"
