"""Makes ``import mooncake.store`` resolve to Yutu's Mooncake-compatible module in every
Python process, worker processes included, when the environment says so.

Engines (SGLang, vLLM, LMCache) import ``mooncake.store`` in processes they start
themselves, where a call to ``yutu.mooncake.install()`` in the launching process does not
reach. The ``yutu-kvcache`` wheel installs a ``.pth`` file that imports this module at
interpreter start-up only when ``YUTU_MOONCAKE`` is set to ``1`` (or ``true``/``yes``); then
this module puts a finder first on ``sys.meta_path``:

- ``mooncake.store`` is ``yutu.mooncake`` (loaded on first import, not at start-up);
- ``mooncake`` is the real package when one is installed (its other modules, e.g.
  ``mooncake.engine``, stay Mooncake's), else an empty package that holds ``store``.

Without the variable nothing changes: an installed Mooncake is never shadowed silently.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

ENV = "YUTU_MOONCAKE"


def enabled(environ=None):
    """Whether the environment opts in."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class _Alias(importlib.abc.Loader):
    """Loads a module name as another module (``mooncake.store`` as ``yutu.mooncake``)."""

    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class _EmptyPackage(importlib.abc.Loader):
    """An empty ``mooncake`` package, for hosts without Mooncake."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []


class MooncakeFinder(importlib.abc.MetaPathFinder):
    """``mooncake.store`` -> ``yutu.mooncake``; ``mooncake`` -> real or empty package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "mooncake.store":
            return importlib.util.spec_from_loader(fullname, _Alias("yutu.mooncake"))
        if fullname == "mooncake":
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
            return importlib.machinery.ModuleSpec(fullname, _EmptyPackage(), is_package=True)
        return None


def install():
    """Puts the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MooncakeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MooncakeFinder())


if enabled():
    install()
