"""The one error kvspec raises for input it refuses, and its families.

Every parser of data that may come from outside (a JSON form, a wire message, a golden
vector file, a simulator frame) refuses with a subclass of :class:`InputError`, whatever
the value: never a ``KeyError``, ``TypeError`` or ``AttributeError`` from deep inside. The
text says what was wrong and where (the form and field, with the offending value shown
bounded, see :func:`kvspec.core.require.show`). ``InputError`` is a ``ValueError``, so code that
catches ``ValueError`` (every refusal of the spec's constructors) keeps working.
"""

from __future__ import annotations


class InputError(ValueError):
    """Input kvspec refuses; the text names what was wrong, where, and the value."""


class FormError(InputError):
    """A plain-data form (a JSON value) that a ``from_dict`` cannot read: not an object,
    a missing or unknown key, or a value its constructor refuses. The text starts with
    the form's name (``StageLayout``, ``TransferCase.source``, ...)."""
