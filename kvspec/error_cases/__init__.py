"""Invalid inputs as data: the type of an error case, the operations cases name, and the
valid inputs several families' cases edit.

:class:`ErrorCase` (:mod:`kvspec.error_cases.case`) names an operation, its arguments as
plain data, the clause that refuses it and the pattern the message must match;
:data:`OPERATIONS` (:mod:`kvspec.error_cases.operations`) is the reference implementation
of every operation a case can name; :mod:`kvspec.error_cases.inputs` holds the valid
inputs the cases change one fact of. The cases themselves are each family's
``errors.py`` (:func:`kvspec.conformance.families.error_cases` gathers them).
"""

from kvspec.error_cases.case import ErrorCase
from kvspec.error_cases.operations import OPERATIONS

__all__ = ["OPERATIONS", "ErrorCase"]
