"""Moved to :mod:`kvspec.testing.strategies` (and the transfer case to
:mod:`kvspec.topology.case`); this name keeps working, with a :class:`DeprecationWarning`,
so that adapters written by an earlier ``kvspec adapter new`` (``from kvspec.strategies
import TransferCase``) run unchanged."""

from __future__ import annotations

import warnings

from kvspec.testing.strategies import *  # noqa: F403  # the whole old namespace
from kvspec.topology.case import TransferCase

__all__ = ["TransferCase"]  # what the old adapters import; the rest comes with the star

warnings.warn(
    "kvspec.strategies moved: TransferCase to kvspec.topology.case, the strategies to "
    "kvspec.testing.strategies; import them from there",
    DeprecationWarning,
    stacklevel=2,
)
