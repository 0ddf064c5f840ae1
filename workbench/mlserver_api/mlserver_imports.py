"""``import mlserver`` for custom runtimes: workbench's layer under MLServer's names, where MLServer is not installed.

A meta-path finder maps ``mlserver`` and its submodules (those runtimes import) to :mod:`workbench.mlserver_api`'s
modules. It is installed while at least one runtime is loaded (:func:`hold` and :func:`release`, counted), so
a runtime's imports at load and any it makes later, inside ``predict``, resolve alike; a process that serves none
never sees an ``mlserver`` it did not install. Where the real package is installed nothing is mapped: it serves,
with one change: its gRPC messages (``mlserver.grpc.dataplane_pb2``) are built in a descriptor pool of their own.
They declare the v2 messages in package ``inference``, as Triton's ``grpc_service.proto`` does, which workbench's
gRPC frontend serves (``tritonclient.grpc.service_pb2``); protobuf's default pool takes each name once, so in the
default pool whichever imports second fails, and ``import mlserver`` imports its gRPC server. Runtimes never send
those messages; workbench's frontends answer gRPC.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Sequence
from types import ModuleType

_OURS = "workbench.mlserver_api"
_CODECS = f"{_OURS}.codecs"
MODULES: dict[str, str] = {
    "mlserver": _OURS,
    "mlserver.logging": _OURS,
    "mlserver.model": f"{_OURS}.mlmodel",
    "mlserver.types": f"{_OURS}.dataplane_types",
    "mlserver.types.dataplane": f"{_OURS}.dataplane_types",
    "mlserver.settings": f"{_OURS}.settings_models",
    "mlserver.utils": f"{_OURS}.model_uri",
    "mlserver.errors": f"{_OURS}.api_errors",
    "mlserver.codecs": _CODECS,
    "mlserver.codecs.base": f"{_CODECS}.codec_base",
    "mlserver.codecs.utils": f"{_CODECS}.content_types",
    "mlserver.codecs.errors": f"{_CODECS}.codec_errors",
    "mlserver.codecs.decorator": f"{_CODECS}.signature_codec",
    "mlserver.codecs.numpy": f"{_CODECS}.tensor_codecs",
    "mlserver.codecs.string": f"{_CODECS}.tensor_codecs",
    "mlserver.codecs.base64": f"{_CODECS}.tensor_codecs",
    "mlserver.codecs.datetime": f"{_CODECS}.tensor_codecs",
    "mlserver.codecs.lists": f"{_CODECS}.tensor_codecs",
    "mlserver.codecs.pandas": f"{_CODECS}.pandas_codec",
}

# The real package's modules of generated protos that clash with Triton's in protobuf's default pool.
_OWN_POOL_MODULES = ("mlserver.grpc.dataplane_pb2",)
_DEFAULT_POOL = "_descriptor_pool.Default()"  # how protoc's Python output names the pool it adds its file to

_lock = threading.Lock()
_holders = 0


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)  # the module itself: one set of classes under both names

    def exec_module(self, module: ModuleType) -> None:
        """Already executed under its own name; importing it as ``mlserver…`` set its ``__spec__`` to the alias's,
        which is put back, so the module stays what it is under its own name."""
        module.__spec__ = importlib.util.find_spec(self.target)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        mapped = MODULES.get(fullname)
        if mapped is None:
            return None
        is_package = fullname in ("mlserver", "mlserver.codecs", "mlserver.types")
        return importlib.machinery.ModuleSpec(fullname, _Alias(mapped), is_package=is_package)


_FINDER = _Finder()


class _OwnPoolLoader(importlib.abc.Loader):
    """Runs a generated ``_pb2`` module with its file added to a pool of its own instead of the default one."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        from google.protobuf import descriptor_pool

        with open(self.origin, encoding="utf-8") as source_file:
            source = source_file.read()
        module.__dict__["_workbench_pool"] = descriptor_pool.DescriptorPool()
        code = compile(source.replace(_DEFAULT_POOL, "_workbench_pool"), self.origin, "exec")
        exec(code, module.__dict__)  # noqa: S102 - the installed package's own file, as its import would run it


class _OwnPoolFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _OWN_POOL_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return spec  # not the generated source this knows: imported as it is
        with open(spec.origin, encoding="utf-8") as source_file:
            if _DEFAULT_POOL not in source_file.read():
                return spec
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_OwnPoolLoader(spec.origin))


_OWN_POOL_FINDER = _OwnPoolFinder()


def real_package_installed() -> bool:
    """Whether an ``mlserver`` other than ours would import (it then serves, unmapped)."""
    if _FINDER in sys.meta_path:
        return False  # ours is installed, so the real one was not there when it was
    return importlib.util.find_spec("mlserver") is not None


def hold() -> None:
    """A runtime is being loaded: ``mlserver`` is ours until :func:`release` (unless the real one is installed)."""
    global _holders
    with _lock:
        _holders += 1
        if _holders != 1:
            return
        if real_package_installed():
            if _OWN_POOL_FINDER not in sys.meta_path:  # stays: modules imported through it stay imported too
                sys.meta_path.insert(0, _OWN_POOL_FINDER)
        else:
            sys.meta_path.insert(0, _FINDER)


def release() -> None:
    """A runtime closed; the last one takes the names away again (modules that bound them keep what they bound)."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
            for name in [n for n, m in sys.modules.items() if n in MODULES and m.__name__.startswith(_OURS)]:
                del sys.modules[name]
