"""What every field adapter shares: importing the engine, one import shim, routing inversion.

Nothing here knows an engine's rules; it only loads engine code and reshapes data.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import traceback
import types
from collections.abc import Mapping, Sequence
from typing import Any

from kvspec.conformance.adapter import AdapterError


def import_engine(module: str, *, adapter: str, install: str) -> Any:
    """Import ``module`` of an engine, or refuse with what to install.

    ``install`` names the package(s) to install; ``make field`` installs every field
    engine into ``.venv-field``. The original error is kept as the cause.
    """
    try:
        return importlib.import_module(module)
    except Exception as error:
        raise AdapterError(
            f"the {adapter!r} adapter imports the engine's own code and needs {install} "
            f"installed (`make field` builds .venv-field with the pinned versions); "
            f"importing {module} failed: {error!r}"
        ) from error


class _Inert(types.ModuleType):
    """A module that stands for an unusable package: attributes resolve, calls raise."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Inert(f"{self.__name__}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self.__name__} is an inert stand-in installed by kvspec.adapters "
            "(the real package cannot load on this machine); nothing on the KV mapping path "
            "may call it"
        )


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == self.root or name.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Inert(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        # A version older than anything real: version checks choose their fallbacks.
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]  # ModuleType declares none


def stand_in_if_unusable(root: str) -> bool:
    """Answer imports of package ``root`` with inert modules if the real one cannot load.

    Used for one case only (see field/NOTES.md): PyPI's torchvision wheels link CUDA
    torch and cannot load next to the CPU build, while SGLang's config package imports
    image processors that import torchvision at module level. Returns whether the
    stand-in was installed. Never hides a package that imports.
    """
    try:
        importlib.import_module(root)
        return False
    except Exception:
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
    if not any(isinstance(f, _InertFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _InertFinder(root))
    return True


def invert_sources(
    sources_by_target: Mapping[int, Sequence[int]], source_ranks: Sequence[int]
) -> dict[int, list[int]]:
    """Each source rank's targets, ascending, from every target's sources [PLAN-3].

    For engines whose mapping is stated from the receiving side only (a pull connector,
    or a push connector whose senders serve whoever registers): the senders' view is
    exactly the inverse of the receivers'.
    """
    targets: dict[int, list[int]] = {src: [] for src in source_ranks}
    for dst in sorted(sources_by_target):
        for src in sources_by_target[dst]:
            targets.setdefault(src, []).append(dst)
    return {src: sorted(set(dsts)) for src, dsts in targets.items()}


def stage_coords(rank: int, tp: int) -> tuple[int, int]:
    """(pp_rank, tp_rank) of stage-local ``rank`` = pp_rank * tp + tp_rank [STAGE-1]."""
    return divmod(rank, tp)


def engine_message(error: BaseException) -> str:
    """An engine's refusal in words: its message, and where it was raised; for a bare
    ``assert`` (no message) the failing statement itself, read from the traceback, so
    evidence always names what the engine checked. Paths are shown from the installed
    package's root (``sglang/srt/...``)."""
    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        path = re.sub(r"^.*/(site-packages|engines/[^/]+)/", "", last.filename)
        where = f" at {path}:{last.lineno} `{(last.line or '').strip()}`"
    return f"{type(error).__name__}: {str(error) or '(no message)'}{where}"
