"""Each model archive's own Python modules, importable by their plain names, at load time and at request time,
without two archives' same-named modules (a ``model.py`` in both) ever meeting.

TorchServe isolates archives by process: each model's worker has the archive's folder on ``sys.path``, so a handler
may ``import model`` when it loads or lazily inside ``handle()``. workbench serves every archive in one process, so
each archive gets a package of its own, ``_workbench_mar_<N>``, whose ``__path__`` is the archive's folder: its
``model.py`` is the module ``_workbench_mar_<N>.model`` (kept in ``sys.modules`` while the archive is loaded, taken
out when it unloads). Plain names reach it two ways:

- ``import`` statements in the archive's modules (at load time and inside functions at request time): every module of
  the archive runs with its own ``__builtins__``, whose ``__import__`` turns a plain name that the archive's folder
  holds (``model``, ``utils.text``) into the package's (``_workbench_mar_<N>.model``). Other names import as ever.
- ``importlib.import_module("model")`` and unpickling (TorchServe's ``BaseHandler`` imports the ``modelFile`` so)
  go through ``sys.modules`` and ``sys.meta_path``: while an archive loads or handles a batch, the thread says which
  archive it serves, and a finder answers that archive's plain names with the same module objects. Such plain
  entries leave ``sys.modules`` when the load or the batch ends.

An archive's folder shadows installed modules of the same name for its own code, as the archive's folder first on
``sys.path`` does in TorchServe; folders without ``__init__.py`` are data, not namespace packages.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import itertools
import os
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PREFIX = "_workbench_mar_"
_serial = itertools.count(1)
_archives: dict[str, ArchiveModules] = {}  # package name → archive
_registry_lock = threading.Lock()
_current = threading.local()  # .archive: the archive this thread is loading or serving


class ArchiveModules:
    """The modules of one loaded archive: a package of its own over the archive's folder."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = str(Path(folder).resolve())
        self.package = f"{PREFIX}{next(_serial)}"
        self._own: dict[str, bool] = {}
        self._aliases: set[str] = set()
        self._lock = threading.Lock()
        real_import = builtins.__import__
        archive = self

        def archive_import(
            name: str,
            globals: dict[str, Any] | None = None,  # noqa: A002 - __import__'s own parameter names
            locals: Any = None,  # noqa: A002
            fromlist: Sequence[str] | None = (),
            level: int = 0,
        ) -> types.ModuleType:
            if level == 0 and archive.owns(name):
                module = real_import(f"{archive.package}.{name}", globals, locals, fromlist, 0)
                if fromlist:
                    return module
                return sys.modules[f"{archive.package}.{name.partition('.')[0]}"]  # `import a.b` binds a
            return real_import(name, globals, locals, fromlist, level)

        self.builtins = dict(builtins.__dict__)
        self.builtins["__import__"] = archive_import
        package = types.ModuleType(self.package, f"The modules of the model archive in {self.folder}")
        package.__path__ = [self.folder]
        package.__package__ = self.package
        package.__spec__ = importlib.machinery.ModuleSpec(self.package, None, is_package=True)
        package.__spec__.submodule_search_locations = [self.folder]
        with _registry_lock:
            _install_finder()
            _archives[self.package] = self
            sys.modules[self.package] = package

    def owns(self, name: str) -> bool:
        """Whether the plain module name ``name`` (its first part) is a module or package of the archive's folder."""
        top = name.partition(".")[0]
        known = self._own.get(top)
        if known is None:
            spec = importlib.machinery.PathFinder.find_spec(top, [self.folder])
            known = spec is not None and spec.loader is not None  # a folder without __init__.py is data
            self._own[top] = known
        return known

    def import_module(self, name: str) -> types.ModuleType:
        """The archive's module ``name`` ("model", "handler"), imported once."""
        return importlib.import_module(f"{self.package}.{name}")

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """This thread loads or serves the archive: plain-name imports through importlib reach its modules; the
        plain entries they leave in ``sys.modules`` go when it ends."""
        previous = getattr(_current, "archive", None)
        _current.archive = self
        try:
            yield
        finally:
            _current.archive = previous
            self._drop_aliases()

    def _alias(self, name: str) -> None:
        with self._lock:
            self._aliases.add(name)

    def _drop_aliases(self) -> None:
        with self._lock:
            aliases, self._aliases = self._aliases, set()
        for name in aliases:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__name__", "") == f"{self.package}.{name}":
                del sys.modules[name]

    def close(self) -> None:
        """The archive unloads: its modules leave ``sys.modules`` (its objects keep what they imported)."""
        self._drop_aliases()
        with _registry_lock:
            _archives.pop(self.package, None)
            # Snapshots first (list() of a dict is one step under the GIL): other threads import meanwhile, and a
            # comprehension over the dict itself fails when they add to it ("dictionary changed size during
            # iteration", seen as a broken archive's error while another archive loaded).
            for name in [n for n in list(sys.modules) if n == self.package or n.startswith(self.package + ".")]:
                sys.modules.pop(name, None)
            for path in [
                p for p in list(sys.path_importer_cache) if p == self.folder or p.startswith(self.folder + os.sep)
            ]:
                sys.path_importer_cache.pop(path, None)  # the finders the archive's lookups left behind


def import_plain(name: str) -> types.ModuleType:
    """``importlib.import_module(name)`` as the archive this thread loads or serves sees it: the archive's own module
    where its folder holds one, never a same-named module that another archive or the process put in ``sys.modules``
    (a plain ``model`` left there would win over the finder); other names as importlib imports them."""
    archive = getattr(_current, "archive", None)
    if archive is not None and archive.owns(name):
        return archive.import_module(name)
    return importlib.import_module(name)


class _ArchiveLoader(importlib.abc.Loader):
    """An archive module's own loader, run with the archive's ``__builtins__``."""

    def __init__(self, loader: Any, archive: ArchiveModules) -> None:
        self._loader = loader
        self._archive = archive

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self._archive.builtins
        self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, get_resource_reader…: the file's loader's
        return getattr(self._loader, name)


class _AliasLoader(importlib.abc.Loader):
    """A plain name (``model``) for the archive module of the same name: the same module object."""

    def __init__(self, archive: ArchiveModules, name: str) -> None:
        self._archive = archive
        self._name = name
        self._spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self._archive.import_module(self._name)
        self._spec = module.__spec__
        self._archive._alias(self._name)  # noqa: SLF001 - the archive's own finder
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._spec  # importlib set the alias's spec on it; the module keeps its own


class _ArchiveFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(PREFIX):
            archive = _archives.get(fullname.partition(".")[0])
            if archive is None or "." not in fullname:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _ArchiveLoader(spec.loader, archive)
            return spec
        archive = getattr(_current, "archive", None)
        if archive is None or not archive.owns(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(archive, fullname))


_finder = _ArchiveFinder()


def _install_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
