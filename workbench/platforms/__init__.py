"""The platforms a version folder can hold, and how a folder's platform is chosen.

The list of platforms exists here once: each is one module that turns a version folder into a
:class:`~workbench.core.servable.Servable`; the manager, the batcher, the dataplane and the frontends never
change per framework. Third-party packages add platforms through the ``workbench.platforms`` entry-point group
(each entry point names a :class:`Platform`).

A version folder's platform comes from, in order: ``model_platform`` in the model config (TF Serving's field), else
``workbench.json`` in the folder (``{"platform": "onnx"}``), else the one well-known file name it holds. Two
candidates fail the load with an error that names both; workbench never guesses.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from workbench.config.options import PackagedModel
from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.platforms.base import HANDLER_FILE, TRITON_CONFIG, VERSION_CONFIG, LoadPolicy

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "workbench.platforms"


PlatformLoader = Callable[[str, int, str, LoadPolicy], Servable]


@dataclasses.dataclass(frozen=True)
class Platform:
    """A framework workbench can serve: the files that identify it and the module that loads it.

    ``module`` is imported only when a version of the platform loads (``loader`` names the function in it), so
    a server of TensorFlow models never imports scikit-learn, and a platform whose library is not installed
    fails only its own versions, with ``extra`` named in the error.

    ``v2_name`` is the name Triton and KServe give the platform in v2 metadata and configs (the name itself when
    they share it). ``inline`` says its calls are native compute that never waits on I/O or on the event loop, so the
    batcher may run a cheap model's calls on the loop (:class:`workbench.batching.scheduler.RunCost`); user code (a
    Python model, a pipeline's steps) always runs on a thread. Plugins' calls always run on a thread.
    """

    name: str
    files: tuple[str, ...]
    module: str
    loader: str = "load"
    extra: str = ""
    v2_name: str = ""
    inline: bool = False
    # The framework's modules, which ``module`` imports only inside its loader: imported first by
    # :meth:`import_framework` when a load is measured (a memory budget), so the model is charged, not the import.
    framework: tuple[str, ...] = ()
    # What ``workbench.export`` asks of its module's ``writer()`` (:mod:`workbench.platforms.export_request`): the
    # ``format=`` names it writes (a model of another platform converted, or its own in a format of its choice), the
    # export keywords its models take beyond the generic ones, and what it writes, for messages ("PyTorch modules").
    export_formats: tuple[str, ...] = ()
    export_options: tuple[str, ...] = ()
    exported_objects: str = ""
    # ``module:function`` listing the models a repository root holds packed in the platform's own files (TorchServe's
    # .mar archives): ``function(root, is_model_name)`` → model name → the folder of its unpacked versions.
    packaged_models: str = ""
    # Its file describes the whole folder (MLflow's MLmodel): the other platforms' files beside it are its parts, so
    # a folder holding it is this platform's.
    describes_folder: bool = False

    def load(self, name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
        load: PlatformLoader = getattr(self.import_module(), self.loader)
        return load(name, version, path, policy)

    def import_framework(self) -> None:
        """Import the platform's module and its framework (PyTorch, scikit-learn...) ahead of a load, and run the
        module's ``warm_up()`` where it has one (what a framework builds once, on its first load, for all)."""
        module = self.import_module()
        for name in self.framework:
            try:
                importlib.import_module(name)
            except ImportError:  # the load itself says what is missing, and how to install it
                return
        warm_up = getattr(module, "warm_up", None)
        if callable(warm_up):
            warm_up()

    def places_on_gpu(self, policy: LoadPolicy) -> bool:
        """Whether its versions load onto a GPU under ``policy``: its module's ``places_on_gpu(policy)`` says, where
        it has one (PyTorch's, by --pytorch_device); asked before a first load, so it must not import the framework."""
        decide = getattr(self.import_module(), "places_on_gpu", None)
        return bool(decide(policy)) if callable(decide) else False

    def import_module(self) -> ModuleType:
        """The platform's module, imported on first use."""
        try:
            return importlib.import_module(self.module)
        except ImportError as exc:
            hint = f"; install it with: pip install 'workbench-serving[{self.extra}]'" if self.extra else ""
            raise ServingError(
                Code.FAILED_PRECONDITION, f"The {self.name} platform needs {exc.name or exc}, which is missing{hint}"
            ) from None


BUILTIN: tuple[Platform, ...] = (
    Platform(
        "tensorflow",
        ("saved_model.pb", "saved_model.pbtxt"),
        "workbench.platforms.tensorflow",
        v2_name="tensorflow_savedmodel",
        inline=True,
        framework=("tensorflow",),
        export_formats=("saved_model", "tensorflow"),  # workbench.publishing's SavedModel route
    ),
    Platform(
        "sklearn",
        ("model.skops", "model.joblib", "model.pkl"),
        "workbench.platforms.sklearn",
        "load",
        "sklearn",
        inline=True,
        framework=("sklearn",),  # and skops, by the module's warm_up(): imported without PyTorch
    ),
    Platform(
        "xgboost",
        ("model.ubj", "model.json"),
        "workbench.platforms.xgboost",
        extra="xgboost",
        inline=True,
        framework=("xgboost",),
    ),
    Platform(
        "lightgbm",
        ("model.txt",),
        "workbench.platforms.lightgbm",
        extra="lightgbm",
        inline=True,
        framework=("lightgbm",),
    ),
    # model.cbm (CatBoost's own format) served by CatBoost; also mlserver_catboost.CatboostModel's.
    Platform(
        "catboost",
        ("model.cbm",),
        "workbench.platforms.catboost",
        extra="catboost",
        inline=True,
        framework=("catboost",),
    ),
    Platform(
        "onnx",
        ("model.onnx",),
        "workbench.platforms.onnx",
        extra="onnx",
        v2_name="onnxruntime_onnx",
        inline=True,
        framework=("onnxruntime", "onnx"),
        export_formats=("onnx",),  # scikit-learn models converted with skl2onnx
    ),
    # A save_pretrained folder (a pipeline's, or a model's with its tokenizer) served by transformers on PyTorch;
    # pickled and TensorFlow weights are named so that their folders are refused with a reason. Before pytorch: its
    # writer takes a transformers model (an nn.Module too) first, and leaves it to pytorch's for torch.export.
    Platform(
        "huggingface",
        (
            "model.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
            "tf_model.h5",
        ),  # fmt: skip
        "workbench.platforms.huggingface",
        extra="huggingface",
        framework=("torch", "transformers"),
        export_options=("tokenizer", "task"),
        exported_objects="transformers pipelines and models",
    ),
    # model.pt2 (torch.export) or model.pt (TorchScript); v2 metadata names it as Triton names its libtorch backend.
    Platform(
        "pytorch",
        ("model.pt2", "model.pt"),
        "workbench.platforms.pytorch",
        extra="pytorch",
        v2_name="pytorch_libtorch",
        inline=True,
        framework=("torch",),
        export_formats=("pt2", "torchscript"),
        export_options=("example_inputs",),
        exported_objects="PyTorch modules",
    ),
    # model.tflite, served by LiteRT; beside a SavedModel only with --prefer_tflite_model (TF Serving's flag).
    Platform(
        "tflite",
        ("model.tflite",),
        "workbench.platforms.tflite",
        extra="tflite",
        v2_name="tensorflow_tflite",
        inline=True,
        framework=("ai_edge_litert.interpreter",),
    ),
    Platform("python", ("model.py",), "workbench.platforms.python"),
    # An MLflow model folder: its flavors say which of workbench's platforms loads it, else MLflow's pyfunc does.
    Platform("mlflow", ("MLmodel",), "workbench.platforms.mlflow", extra="mlflow", describes_folder=True),
    Platform("pipeline", ("pipeline.yaml",), "workbench.platforms.pipeline", v2_name="ensemble"),
    # An unpacked TorchServe model archive (workbench.platforms.torchserve_archives writes the second file beside it).
    Platform(
        "torchserve",
        ("MAR-INF/MANIFEST.json", "MAR-INF/workbench-source.json"),
        "workbench.platforms.torchserve",
        extra="pytorch",
        framework=("torch",),
        packaged_models="workbench.platforms.torchserve_archives:store_models",
    ),
    # A folder laid out for MLServer: each model-settings.json a version (workbench.platforms.mlserver_repository
    # writes the version folders, naming the platform); served by its implementation's native platform, MLflow's, or
    # a custom runtime (workbench.platforms.mlserver_runtime).
    Platform(
        "mlserver",
        (),
        "workbench.platforms.mlserver",
        packaged_models="workbench.platforms.mlserver_repository:repository_models",
    ),
    # SavedModel signatures answered with zeros: the frontends' ceiling, measured by the benchmarks. Chosen only
    # by name (no files of its own).
    Platform("workbench_null", (), "workbench.platforms.tensorflow", loader="load_null", inline=True),
)
# The built-in platforms whose cheap calls may run on the event loop.
INLINE_PLATFORMS = frozenset(platform.name for platform in BUILTIN if platform.inline)


@functools.cache
def registry() -> Mapping[str, Platform]:
    """Every platform by name: the built-in ones, then those installed packages register."""
    platforms = {p.name: p for p in BUILTIN}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            platform = entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the server
            log.error("Platform plugin %s could not be loaded: %s", entry.value, exc)
            continue
        if not isinstance(platform, Platform):
            log.error("Platform plugin %s is not a workbench.platforms.Platform", entry.value)
            continue
        if platform.name in platforms:
            log.error("Platform plugin %s reuses the name %s; ignored", entry.value, platform.name)
            continue
        platforms[platform.name] = platform
    return platforms


def names() -> tuple[str, ...]:
    return tuple(registry())


def v2_name(name: str) -> str:
    """The v2 name of a platform ("tensorflow" → "tensorflow_savedmodel"); unknown ones as they are."""
    platform = registry().get(name)
    return (platform.v2_name or platform.name) if platform is not None else name


def model_files() -> tuple[str, ...]:
    """Every file name that identifies a platform's model in a version folder."""
    return tuple(f for platform in registry().values() for f in platform.files)


def packaged_models(root: Path, is_model_name: Callable[[str], bool]) -> dict[str, PackagedModel]:
    """The models repository root ``root`` holds packed in platforms' own files (TorchServe's ``.mar`` archives,
    MLServer's ``model-settings.json``), unpacked where they changed: model name → the folder of its versions (and
    the labels its files name). A platform's function answers a folder or a :class:`PackagedModel` per model."""
    found: dict[str, PackagedModel] = {}
    for platform in registry().values():
        if platform.packaged_models:
            module, _, function = platform.packaged_models.partition(":")
            models = getattr(importlib.import_module(module), function)(root, is_model_name)
            for name, where in models.items():
                if name in found:
                    log.error("Model %s is packed in the files of two platforms in %s; the first is served", name, root)
                    continue
                found[name] = where if isinstance(where, PackagedModel) else PackagedModel(str(where))
    return found


def get(name: str) -> Platform:
    try:
        return registry()[name]
    except KeyError:
        raise ServingError(
            Code.UNIMPLEMENTED, f'model_platform "{name}" is not supported (supported: {", ".join(names())})'
        ) from None


def _declared(path: Path) -> str:
    config = path / VERSION_CONFIG
    try:
        document = json.loads(config.read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{config} is not valid JSON: {exc}") from None
    platform = document.get("platform") if isinstance(document, dict) else None
    if not isinstance(platform, str) or not platform:
        raise ServingError(Code.INVALID_ARGUMENT, f'{config} must name the folder\'s platform: {{"platform": "onnx"}}')
    return platform


def detect(path: str | Path, prefer_tflite: bool = False) -> Platform:
    """The platform of a version folder without a configured one: its ``workbench.json``, else its files. A folder
    holding both a SavedModel and ``model.tflite`` is TF Serving's: the SavedModel serves, unless ``prefer_tflite``
    (``--prefer_tflite_model``)."""
    folder = Path(path)
    if not folder.is_dir():
        raise ServingError(Code.NOT_FOUND, f"Model version folder does not exist: {folder}")
    declared = _declared(folder)
    if declared:
        return get(declared)
    found = [(p, f) for p in registry().values() for f in p.files if (folder / f).is_file()]
    candidates = {p.name: p for p, _ in found}
    describing = [p for p in candidates.values() if p.describes_folder]
    if len(describing) == 1:
        return describing[0]
    if set(candidates) == {"tensorflow", "tflite"}:
        return candidates["tflite" if prefer_tflite else "tensorflow"]
    if len(candidates) == 1:
        return next(iter(candidates.values()))
    if not candidates:
        from workbench.platforms.tensorflow import legacy_export_hint

        known = ", ".join(f for p in registry().values() for f in p.files)
        raise ServingError(
            Code.NOT_FOUND,
            f"No model found in {folder}: expected one of {known}, or a {VERSION_CONFIG} naming the platform"
            + legacy_export_hint(folder),
        )
    listed = ", ".join(f"{f} ({p.name})" for p, f in found)
    raise ServingError(
        Code.FAILED_PRECONDITION,
        f"{folder} holds models of several platforms: {listed}. Keep one, or name the platform in the model "
        f'config (model_platform) or in {VERSION_CONFIG} ({{"platform": "..."}})',
    )


class Loader:
    """The manager's loader: picks each version's platform, loads it, and wraps it in its handler if it has one."""

    def __init__(self, policy: LoadPolicy = LoadPolicy()) -> None:
        self.policy = policy

    def _choose(self, path: str, platform: str) -> Platform:
        """The configured platform, else the folder's. With ``--prefer_tflite_model`` a folder's ``model.tflite``
        serves also where the config says ``tensorflow`` (TF Serving's configs do; TF Lite is its TensorFlow)."""
        chosen = get(platform) if platform else detect(path, self.policy.prefer_tflite_model)
        if chosen.name == "tensorflow" and self.policy.prefer_tflite_model and (Path(path) / "model.tflite").is_file():
            return get("tflite")
        return chosen

    def prepare(self, name: str, version: int, path: str, platform: str = "") -> None:
        """Import the platform of the version at ``path`` (its framework: PyTorch, scikit-learn...), which a process
        pays once: a load measured after this is charged the model alone, not the framework's hundreds of MiB."""
        if not (Path(path).parent / TRITON_CONFIG).is_file():  # a Triton model's config names its backend
            self._choose(path, platform).import_framework()

    def places_on_gpu(self, path: str, platform: str = "") -> bool:
        """Whether the version at ``path`` will load onto a GPU (a memory budget's estimate before its first load);
        a version whose platform cannot be told, or will not import, says no here and fails its own load."""
        if (Path(path).parent / TRITON_CONFIG).is_file():
            return False  # Triton's models place themselves by their config's instance groups, read at load
        try:
            return self._choose(path, platform).places_on_gpu(self.policy)
        except (ServingError, ImportError):
            return False

    def __call__(self, name: str, version: int, path: str, platform: str = "") -> Servable:
        if (Path(path).parent / TRITON_CONFIG).is_file():
            # A Triton model (its folder holds config.pbtxt): the config says how it is served.
            from workbench.platforms.triton import load as load_triton

            return load_triton(name, version, path, self.policy, platform)
        chosen = self._choose(path, platform)
        servable = chosen.load(name, version, path, self.policy)
        servable.platform = chosen.name
        # workbench's own handler.py beside a model; a TorchServe archive's handler.py is the archive's own (its
        # platform runs it as TorchServe does).
        if chosen.name not in ("workbench_null", "torchserve") and (Path(path) / HANDLER_FILE).is_file():
            from workbench.platforms.handler import with_handler

            try:
                handled = with_handler(servable, Path(path) / HANDLER_FILE, self.policy)
            except BaseException:
                servable.close()
                raise
            handled.platform = chosen.name
            return handled
        return servable
