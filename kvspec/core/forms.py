"""Reading plain-data forms (JSON values) into the spec's objects, refusing anything else.

A ``from_dict`` is a parser: its input may be a golden vector, a replay given on a command
line or a message. :func:`read_form` checks that the value is an object with the expected
keys; :func:`build` runs the constructor and turns any refusal into a :class:`FormError`
that names the form. So for any JSON value a ``from_dict`` returns an object or raises
``FormError`` (see :mod:`kvspec.core.errors`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from kvspec.core.errors import FormError
from kvspec.core.require import show

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


def read_form(
    where: str,
    data: object,
    *,
    required: Iterable[str] = (),
    optional: Iterable[str] = (),
    others: bool = False,
) -> dict[str, Any]:
    """``data`` as a dict, refused unless it is an object holding every ``required`` key
    and no key outside ``required`` and ``optional`` (a misspelt key is not ignored). With
    ``others``, ``data`` is a record that holds the form among keys of its own (a golden
    vector's case): only the form's keys are read and returned."""
    if not isinstance(data, Mapping):
        raise FormError(f"{where} must be a JSON object, got {show(data)}")
    wanted, allowed = set(required), set(required) | set(optional)
    keys = set(data) & allowed if others else set(data)
    missing = sorted(wanted - keys)
    unknown = sorted(show(k, 30) for k in list(keys - allowed)[:8])
    if missing or unknown:
        parts = [f"missing {missing}"] if missing else []
        if unknown:
            parts.append(f"unknown keys [{', '.join(unknown)}]")
        raise FormError(f"{where}: {' and '.join(parts)}; its keys are {sorted(allowed)}")
    return {k: data[k] for k in keys}


def form_list(where: str, value: object) -> tuple[Any, ...]:
    """A JSON array's items, refused if ``value`` is not an array."""
    if not isinstance(value, list | tuple):
        raise FormError(f"{where} must be a JSON array, got {show(value)}")
    return tuple(value)


def build(where: str | None, make: Callable[[], T]) -> T:
    """``make()``, with the constructor's refusal (or a wrong type deep inside it) raised
    as a :class:`FormError` that names the form (``where``; ``None`` where the
    constructor's own messages already do, as the payload's name their fields)."""
    try:
        return make()
    except FormError:
        raise
    except (ValueError, TypeError) as error:
        raise FormError(str(error) if where is None else f"{where}: {error}") from None


def dataclass_form(
    cls: type[D],
    data: object,
    *,
    where: str | None = None,
    required: Iterable[str] = (),
    lists: Iterable[str] = (),
) -> D:
    """A dataclass built from a form whose keys are its fields (``required`` ones must be
    present; ``lists`` are JSON arrays, made tuples)."""
    where = where or cls.__name__
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    args = read_form(where, data, required=required, optional=fields - set(required))
    for name in lists:
        if args.get(name) is not None:
            args[name] = form_list(f"{where}.{name}", args[name])
    return build(where, lambda: cls(**args))
