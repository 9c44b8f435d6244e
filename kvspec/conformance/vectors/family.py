"""What a vector family is: a :class:`Family` (its name, the adapter capabilities it
needs, a deterministic ``export`` and a ``check`` that replays one case), the plain-data
:data:`Case` it writes and the :data:`Tensors` beside it, and :class:`NotApplicable`,
which a check raises when the adapter lacks what a case needs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvspec.conformance.adapter import FullAdapter

Case = dict[str, Any]
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Family:
    """One kind of vector: how to make its cases and how to replay one through an adapter.

    ``check`` returns None when the adapter agrees, else what differs; it raises
    :class:`NotApplicable` when the adapter lacks what the case needs.
    """

    name: str
    needs: tuple[str, ...]
    export: Callable[[random.Random], tuple[list[Case], Tensors]]
    check: Callable[[FullAdapter, Case, Tensors], str | None]


class NotApplicable(Exception):
    pass
