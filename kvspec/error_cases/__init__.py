"""Invalid inputs as data: what must be refused, by which clause, with which message.

:data:`ERROR_CASES` (the table, :mod:`kvspec.error_cases.cases`) names for each invalid
input an operation, its arguments as plain data, the clause that refuses it and the
pattern the message must match; :data:`OPERATIONS` (:mod:`kvspec.error_cases.operations`)
is the reference implementation of every operation a case can name.
"""

from kvspec.error_cases.cases import ERROR_CASES, ErrorCase
from kvspec.error_cases.operations import OPERATIONS

__all__ = ["ERROR_CASES", "OPERATIONS", "ErrorCase"]
