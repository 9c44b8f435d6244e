"""Where a check reads the layout its example names [LAYOUT-1, LAYOUT-5].

An example is a JSON form: drawn, pinned, replayed from a counterexample (``--replay``) or
exported as a golden vector, and handed to the adapter as it is. Its layout travels in it
as the reference the adapter is handed (a preset's name, a layout file's path), so a check
that needs the layout's facts parses that reference here, where the form is read; the
draws, which take their names from the adapter's domain, read the values the domain
parsed once (:meth:`~kvspec.conformance.domain.Domain.layout`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvspec.memory.cache_layout import CacheLayout, get_layout


def example_layout(example: Mapping[str, Any], key: str = "layout") -> CacheLayout:
    """The layout ``example`` names under ``key`` (``"layout"``, ``"target"``, a side's
    ``"layout"``); an unknown name is refused with the known ones [LAYOUT-1]."""
    return get_layout(example[key])
