"""The generated Kubernetes client (``kubernetes_asyncio``), its classes loaded only when first used.

``kubernetes_asyncio.client``'s ``__init__`` imports every API class and every model of the
OpenAPI document — about 700 modules, 32 MiB of an idle operator's 120 (measured with
``/proc/self/status`` around the import) — of which the operator uses a dozen APIs and a few
models. The library's maintainers know it (tomplus/kubernetes_asyncio#293: the generator has no
option not to import every model from the package ``__init__`` files). So before the library is
first imported, :func:`install` puts in ``sys.modules`` three packages that stand for
``kubernetes_asyncio.client``, ``.client.api`` and ``.client.models``: the same directories, the
same names — read from the library's own ``__init__`` files, so a new version brings its own table —
each class imported from its module on first access (PEP 562). Everything else of the library
(its ``ApiClient``, configuration, streams, exceptions) is its own code, unchanged.

kopf imports ``kubernetes_asyncio`` when its registry is created (to offer a login through it), so
the operator's entry point calls :func:`install` before it imports kopf; the ``episode_operator.kube``
package calls it too, for every other program that reaches the client through the kube layer.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

ROOT = "kubernetes_asyncio"
LAZY_PACKAGES = (f"{ROOT}.client", f"{ROOT}.client.api", f"{ROOT}.client.models")


class LazyPackage(types.ModuleType):
    """A package whose names are imported from their modules on first access."""

    def __init__(self, name: str, directory: Path, names: dict[str, str], version: str | None) -> None:
        super().__init__(name)
        self.__path__ = [str(directory)]
        self.__file__ = str(directory / "__init__.py")
        self.__package__ = name
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=self.__file__, is_package=True)
        self.__spec__.submodule_search_locations = self.__path__
        self.__all__ = sorted(names)
        self._modules_of = names
        if version is not None:
            self.__version__ = version

    def __getattr__(self, attribute: str) -> object:
        if attribute.startswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {attribute!r}")
        module = self._modules_of.get(attribute)
        if module is not None:
            value = getattr(importlib.import_module(module), attribute)
        elif importlib.util.find_spec(f"{self.__name__}.{attribute}") is not None:
            value = importlib.import_module(f"{self.__name__}.{attribute}")  # a subpackage or module
        else:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attribute!r}")
        setattr(self, attribute, value)  # found once: later lookups are plain attribute reads
        return value

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._modules_of})


def exported(init: Path) -> tuple[dict[str, str], str | None]:
    """What a generated ``__init__.py`` imports (``from MODULE import NAME`` → NAME: MODULE) and its ``__version__``."""
    names: dict[str, str] = {}
    version: str | None = None
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            version = ast.literal_eval(node.value)
    names.pop("absolute_import", None)  # `from __future__ import absolute_import`
    return names, version


def install() -> bool:
    """Stand the lazy packages in for the generated ones; False (nothing done) if the library is not
    installed or its client was imported already."""
    if any(name in sys.modules for name in LAZY_PACKAGES):
        return False
    spec = importlib.util.find_spec(ROOT)
    if spec is None or spec.origin is None:
        return False
    root = Path(spec.origin).parent
    for name in LAZY_PACKAGES:
        directory = root.joinpath(*name.split(".")[1:])
        names, version = exported(directory / "__init__.py")
        sys.modules[name] = LazyPackage(name, directory, names, version)
    # The library's own package next, as importing its client would: its modules import one another
    # in that order (its config imports the client's ApiClient, which imports the models package).
    importlib.import_module(ROOT)
    return True
