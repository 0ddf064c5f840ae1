"""TF Serving's generated protos without TensorFlow: importing this module loads them, in about 0.1 s.

``tensorflow_serving.apis.predict_pb2`` and its siblings import TensorFlow's generated protos
(``tensorflow.core.framework.tensor_pb2``, ...). Those are plain protobuf modules, but Python runs a package's
``__init__`` before any of its submodules, and ``tensorflow/__init__.py`` imports all of TensorFlow: seconds, and
hundreds of megabytes, before a server could open its ports, for a repository of scikit-learn models that never
needs it.

So, while TensorFlow is not imported yet, its package is stood in for by an empty module with the same
``__path__`` during the imports below, then taken out of ``sys.modules`` again. The submodules stay: they are the
genuine generated modules (same files, same descriptor pool), so a later ``import tensorflow`` in the same process
runs the real ``__init__``, which finds them in ``sys.modules`` and uses them; ``tf.make_tensor_proto`` and
``predict_pb2.PredictRequest`` share one ``TensorProto`` class as before. Where TensorFlow is already imported
(a notebook kernel that trained a Keras model), the imports are plain ones.

What is loaded is every module of ``tensorflow_serving.apis`` and ``tensorflow_serving.config`` (everything
workbench speaks over TF Serving's APIs, configs and logs) and the TensorFlow protos workbench reads on its own
(:data:`TENSORFLOW_PROTOS`). Importing any other ``tensorflow.*`` module later still imports TensorFlow, as it
should.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import pkgutil
import sys
import threading
import types
from collections.abc import Iterator

__all__ = ["TENSORFLOW_PROTOS", "load", "stand_in"]

# Read by workbench without TF Serving's protos pulling them in (saved_model.pb sniffing, SignatureDefs, Examples).
TENSORFLOW_PROTOS = (
    "tensorflow.core.example.example_pb2",
    "tensorflow.core.framework.tensor_pb2",
    "tensorflow.core.protobuf.config_pb2",
    "tensorflow.core.protobuf.meta_graph_pb2",
    "tensorflow.core.protobuf.saved_model_pb2",
)
_SERVING_PACKAGES = ("tensorflow_serving.apis", "tensorflow_serving.config")

_lock = threading.Lock()
_loaded = False


def _serving_modules() -> Iterator[str]:
    for package in _SERVING_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:
            continue
        for module in pkgutil.iter_modules(spec.submodule_search_locations):
            yield f"{package}.{module.name}"


def _import_all() -> None:
    for name in (*TENSORFLOW_PROTOS, *_serving_modules()):
        importlib.import_module(name)


@contextlib.contextmanager
def stand_in(spec: importlib.machinery.ModuleSpec, purpose: str) -> Iterator[bool]:
    """An empty ``tensorflow`` package in place of the real one while the block imports submodules of it.

    Yields False (and stands nothing in) when TensorFlow was imported for real meanwhile. The one home of this trick:
    TF Serving's protos here, TensorFlow's SavedModel runtime in :mod:`workbench.runtime.tensorflow_runtime`.
    """
    module = types.ModuleType("tensorflow", f"Stands in for TensorFlow while {purpose}.")
    module.__path__ = list(spec.submodule_search_locations or ())
    module.__spec__ = spec
    module.__file__ = spec.origin
    # Another thread importing TensorFlow meanwhile must wait rather than get the stand-in: Python waits on a
    # module's import lock while its spec says it is initializing, and the lock is held here until it is gone.
    # (_ModuleLockManager is importlib's own per-module lock, unchanged since Python 3.3.)
    from importlib._bootstrap import _ModuleLockManager  # type: ignore[attr-defined]

    with _ModuleLockManager("tensorflow"):
        if "tensorflow" in sys.modules:  # imported for real while this thread waited for the lock
            yield False
            return
        spec._initializing = True  # type: ignore[attr-defined]  # noqa: SLF001
        sys.modules["tensorflow"] = module
        try:
            yield True
        finally:
            if sys.modules.get("tensorflow") is module:
                del sys.modules["tensorflow"]
            spec._initializing = False  # type: ignore[attr-defined]  # noqa: SLF001


def load() -> None:
    """Import TF Serving's protos (and TensorFlow's they use) without running ``tensorflow/__init__``. Idempotent."""
    global _loaded
    with _lock:
        if _loaded:
            return
        spec = importlib.util.find_spec("tensorflow") if "tensorflow" not in sys.modules else None
        if spec is None or spec.submodule_search_locations is None:
            _import_all()  # already imported (or not a package on disk): nothing to keep out
        else:
            with stand_in(spec, "its generated protos are imported"):
                _import_all()
        _loaded = True


load()
