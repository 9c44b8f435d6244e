"""Make SGLang's disaggregation package importable on a CPU-only machine (repro helper).

`sglang/srt/configs/__init__.py` imports image processors that import torchvision at
module level; PyPI's torchvision wheels link CUDA torch and cannot load next to the CPU
build. Where torchvision does not import, answer its imports with inert modules (any call
raises); nothing on the KV mapping path uses it. Where it imports, this does nothing.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Inert(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Inert(f"{self.__name__}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} is an inert stand-in")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Inert(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = "0.0.0"


try:
    import torchvision  # noqa: F401
except Exception:
    for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Finder())
