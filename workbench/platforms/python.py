"""The Python platform: a ``model.py`` in the version folder defines the model as a class.

The contract (:class:`PythonModel`)::

    import numpy as np
    import workbench

    class Doubler(workbench.PythonModel):
        inputs = {"x": ("float32", [-1, 4])}      # serving_default's inputs and outputs: (dtype, shape)
        outputs = {"y": ("float32", [-1, 4])}

        def load(self, path):                     # optional: the version folder, for files beside model.py
            self.factor = 2.0

        def predict(self, inputs):                # dict of numpy arrays in, dict of array-likes out
            return {"y": inputs["x"] * self.factor}

- The module defines one subclass of :class:`PythonModel` (or, without importing workbench, a class named
  ``Model`` with the same attributes). It is created with no arguments, then ``load(path)`` is called once.
- ``serving_default`` runs ``predict``; more signatures are declared in ``signatures`` (name →
  ``{"inputs": ..., "outputs": ...}``) and each runs the method of its name. Types are TF Serving's names or
  numpy's; strings arrive and may be returned as numpy arrays of ``bytes`` (``str`` results are encoded).
- Requests are batched along dimension 0 unless the class sets ``batchable = False``; ``predict`` may run on
  several threads at once unless it sets ``thread_safe = False``.
- Raise ``ValueError`` (or ``TypeError``) for a request the model cannot take: the client gets 400 /
  INVALID_ARGUMENT with its message. Anything else is 500 / INTERNAL, naming the exception.
- ``close()`` is called when the version unloads.
- A **stateful** model (``stateful = True``) serves sequences (Triton's sequence batching): its
  ``predict(self, inputs, state)`` gets one request of a sequence and the state it returned for the request before
  (``None`` at the sequence's start), and returns ``(outputs, new_state)``::

      class RunningTotal(workbench.PythonModel):
          inputs = {"x": ("float32", [-1, 1])}
          outputs = {"total": ("float32", [-1, 1])}
          stateful = True

          def predict(self, inputs, state):
              total = inputs["x"] + (0.0 if state is None else state)
              return {"total": total}, total

  Clients name the sequence with the request parameters ``sequence_id``, ``sequence_start`` and ``sequence_end``.
  ``sequence_batching`` (a dict: ``strategy`` "oldest" or "direct", ``max_idle_seconds`` (default 60),
  ``max_batch_size``, ``max_queue_delay_seconds``) tunes the batcher; ``control_inputs`` (kind → input name, kinds
  START, END, READY, CORRID) has Triton's control values handed in among the inputs.
- A **decoupled** model (``decoupled = True``, Triton's decoupled transaction policy) answers a request with 0..n
  responses: its ``predict`` (and each signature's method) is a generator that yields one dict of outputs per
  response::

      class Countdown(workbench.PythonModel):
          inputs = {"n": ("int32", [1])}
          outputs = {"left": ("int32", [1])}
          decoupled = True

          def predict(self, inputs):
              for left in range(int(inputs["n"][0]) - 1, -1, -1):
                  yield {"left": [left]}

  Each yielded dict is checked as ``predict``'s answer is and sent at once; ending the generator ends the request
  (yielding nothing is fine: the request then gets no response but the final one). The generator is advanced on
  a worker thread only when the client is ready for the next response, and closed between two yields when the
  client goes away or the deadline passes (a ``try/finally`` in it runs then). A decoupled model is never batched
  across requests (its inputs have no batch dimension to share) and is served over streams only: gRPC
  ``ModelStreamInfer`` and REST ``/generate``, ``/generate_stream``; ``ModelInfer``, v2 ``/infer`` and TF
  Serving's APIs refuse it as UNIMPLEMENTED, in Triton's words. It cannot be stateful too.

``model.py`` is code from the repository: it is imported only when the server allows Python models
(``--allow_python_models``), each load under a module name of its own, so versions never share module state.

Why one module of this size: the Python platform is one contract, read by users as one file: the base class,
how a model.py is loaded and run (stateless, stateful, decoupled), and how ``export`` writes a class back as source.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import linecache
import logging
import textwrap
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from workbench.core import text_generation as tg
from workbench.core.errors import Code, ServingError
from workbench.core.sequence_contract import Controls, SequenceSettings, Strategy
from workbench.core.servable import Servable, streams_only
from workbench.core.signatures import DEFAULT_SIGNATURE, Signature
from workbench.platforms._user_code import (
    call_user,
    conform_outputs,
    declared_signature,
    forget_module,
    import_file,
    require_python,
)
from workbench.platforms.base import LoadPolicy
from workbench.platforms.chat_templates import compile_chat_template, render_chat_template

log = logging.getLogger(__name__)

MODEL_FILE = "model.py"
DEFAULT_METHOD = "predict"
_END = object()  # what next() answers when a decoupled model's generator is over


class PythonModel:
    """The base of a model written in Python: declare its tensors, implement ``predict`` (see the module's doc)."""

    inputs: ClassVar[Mapping[str, Any]] = {}
    outputs: ClassVar[Mapping[str, Any]] = {}
    signatures: ClassVar[Mapping[str, Any]] = {}
    batchable: ClassVar[bool] = True
    thread_safe: ClassVar[bool] = True
    stateful: ClassVar[bool] = False
    decoupled: ClassVar[bool] = False

    def load(self, path: Path) -> None:
        """Read what the model needs from its version folder (called once, before any request)."""

    def predict(self, inputs: dict[str, np.ndarray]) -> Mapping[str, Any]:
        """``serving_default``: inputs by name → outputs by name."""
        raise NotImplementedError(f"{type(self).__name__} does not implement predict")

    def close(self) -> None:
        """Free what the model holds; called once, when the version unloads."""


# ------------------------------------------------------------------------------------------ loading
def model_class(module: types.ModuleType, path: Path) -> type:
    """The model class ``module`` defines: its one PythonModel subclass, else its class named ``Model``."""
    own = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, PythonModel)
        and value is not PythonModel
        and value.__module__ == module.__name__
    ]
    if len(own) > 1:
        names = ", ".join(sorted(c.__name__ for c in own))
        raise ServingError(
            Code.INVALID_ARGUMENT, f"{path} defines several models ({names}); keep one PythonModel subclass per file"
        )
    if own:
        return own[0]
    candidate = getattr(module, "Model", None)
    if isinstance(candidate, type):
        return candidate
    raise ServingError(
        Code.INVALID_ARGUMENT,
        f"{path} defines no model: define a subclass of workbench.PythonModel (or a class named Model) "
        "with inputs, outputs and predict",
    )


def model_signatures(cls: type, where: str) -> tuple[dict[str, Signature], dict[str, str]]:
    """The signatures a model class declares, and the method each runs."""
    # A decoupled model answers each request on its own: its requests share no batch.
    batchable = bool(getattr(cls, "batchable", True)) and not getattr(cls, "decoupled", False)
    declared: dict[str, Any] = dict(getattr(cls, "signatures", None) or {})
    inputs, outputs = getattr(cls, "inputs", None), getattr(cls, "outputs", None)
    if inputs or outputs:
        if DEFAULT_SIGNATURE in declared:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"{where} declares {DEFAULT_SIGNATURE} twice: in inputs/outputs and in signatures; keep one",
            )
        declared = {DEFAULT_SIGNATURE: {"inputs": inputs, "outputs": outputs}, **declared}
    if not declared:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f'{where} declares no tensors: set inputs = {{"x": ("float32", [-1, 4])}} and outputs likewise',
        )
    signatures: dict[str, Signature] = {}
    methods: dict[str, str] = {}
    for name, spec in declared.items():
        method = DEFAULT_METHOD if name == DEFAULT_SIGNATURE else name
        if not callable(getattr(cls, method, None)):
            raise ServingError(
                Code.INVALID_ARGUMENT, f'{where} declares signature "{name}" but has no method {method}(inputs)'
            )
        signatures[name] = declared_signature(name, spec, f"{where}.signatures[{name}]", batchable=batchable)
        methods[name] = method
    return signatures, methods


class PythonServable(Servable):
    """An instance of a model class, run method by signature."""

    def __init__(self, name: str, version: int, path: str, module: types.ModuleType | None, model: Any) -> None:
        self.name, self.version, self.path = name, version, path
        self._module = module
        self._model = model
        cls = type(model)
        self._label = f"Model {name} version {version} ({cls.__name__})"
        self.signatures, self._methods = model_signatures(cls, f"{cls.__name__} in {path}")
        # A model that says it is not thread-safe runs one request (or batch) at a time.
        self._lock: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if getattr(cls, "thread_safe", True) else threading.Lock()
        )
        self.decoupled = bool(getattr(cls, "decoupled", False))
        if self.decoupled and getattr(cls, "stateful", False):
            raise ServingError(Code.INVALID_ARGUMENT, f"{self._label}: a model is stateful or decoupled, not both")
        if getattr(cls, "stateful", False):
            self.sequence = stateful_settings(cls, self._label)
            self._controls: Mapping[str, str] = dict(getattr(cls, "control_inputs", None) or {})

    def run_step(
        self,
        signature: Signature,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        state: Any,
        controls: Controls,
    ) -> tuple[dict[str, np.ndarray], Any]:
        """One request of a sequence with its state: ``predict(inputs, state)`` → ``(outputs, new_state)``."""
        method_name = self._methods[signature.name]
        who = f"{self._label}.{method_name}"
        feed = dict(inputs)
        for kind, value in _control_values(controls).items():
            if kind in self._controls:
                feed[self._controls[kind]] = value
        with self._lock:
            answer = call_user(getattr(self._model, method_name), who, feed, state)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise ServingError(
                Code.INTERNAL, f"{who} is stateful: it must return (outputs, new_state), not {type(answer).__name__}"
            )
        result, new_state = answer
        return conform_outputs(signature, result, outputs, who), new_state

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        if self.decoupled:
            raise streams_only(self._label)
        method_name = self._methods[signature.name]
        method: Callable[[dict[str, np.ndarray]], Any] = getattr(self._model, method_name)
        who = f"{self._label}.{method_name}"
        with self._lock:
            result = call_user(method, who, dict(inputs))
        return conform_outputs(signature, result, outputs, who)

    def run_decoupled(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        """The responses the model's generator yields, each conformed as ``run``'s answer is.

        Each step holds the model's lock (``thread_safe = False``) only while the generator runs, never while a
        response waits for its client, so a slow client does not stall the model's other requests.
        """
        method_name = self._methods[signature.name]
        who = f"{self._label}.{method_name}"
        with self._lock:
            answers = call_user(getattr(self._model, method_name), who, dict(inputs))
        if isinstance(answers, Mapping) or not isinstance(answers, Iterable):
            raise ServingError(
                Code.INTERNAL,
                f"{who} is decoupled: it must yield dicts of outputs (be a generator), not return "
                f"{type(answers).__name__}",
            )
        responses = iter(answers)
        try:
            while True:
                with self._lock:
                    result = call_user(next, who, responses, _END)
                if result is _END:
                    return
                yield conform_outputs(signature, result, outputs, who)
        finally:  # ended, failed or closed early (the client left): let the model's own finally blocks run now
            close = getattr(responses, "close", None)
            if callable(close):
                try:
                    with self._lock:
                        close()
                except Exception:  # the request is over either way; the model's error is logged
                    log.exception("%s: closing its generator failed", who)

    def close(self) -> None:
        try:
            close = getattr(self._model, "close", None)
            if callable(close):
                close()
        except Exception:  # an unload must finish; the model's own error is only logged
            log.exception("%s: close() failed", self._label)
        finally:
            forget_module(self._module)


class ChatPythonServable(PythonServable):
    """A Python text generator that makes its own chat prompts (``core.text_generation.ChatTemplating``): its
    ``chat_prompt(messages)`` method (a :class:`~workbench.platforms.python_text.TextGenerator`'s renders its
    ``chat_template``), else its ``chat_template`` alone (a model written without workbench); and counts tokens with
    its ``count_tokens`` where it has one. Both run on the server's event loop, outside the model's lock: they must
    be quick, as a tokenizer's template is."""

    def __init__(self, name: str, version: int, path: str, module: types.ModuleType | None, model: Any) -> None:
        super().__init__(name, version, path, module, model)
        template = getattr(model, "chat_template", None)
        if template is not None and not isinstance(template, str):
            what = type(template).__name__
            raise ServingError(Code.INVALID_ARGUMENT, f"{self._label}: chat_template must be a Jinja str, not {what}")
        self._template = template or None
        if self._template is not None:
            try:
                compile_chat_template(self._template)  # a template Jinja cannot read fails the load, not a request
            except ServingError as exc:
                raise ServingError(exc.code, f"{self._label}: {exc.message}") from None

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]]) -> str:
        plain = [{**m, "content": tg.message_text(m)} for m in messages]
        own = getattr(self._model, "chat_prompt", None)
        if callable(own):
            prompt = call_user(own, f"{self._label}.chat_prompt", plain)
            if not isinstance(prompt, str):
                what = type(prompt).__name__
                raise ServingError(Code.INTERNAL, f"{self._label}.chat_prompt must return a str, not {what}")
            return prompt
        assert self._template is not None  # chosen for one or the other (chat_model)
        return render_chat_template(self._template, plain, self._label)

    def count_tokens(self, text: str) -> int:
        own = getattr(self._model, "count_tokens", None)
        if not callable(own):
            return len(text.split())
        return int(call_user(own, f"{self._label}.count_tokens", text))


def chat_model(model: Any) -> bool:
    """Whether a model makes its own chat prompts: a decoupled model with a ``chat_prompt`` method or a
    ``chat_template``."""
    if not getattr(type(model), "decoupled", False):
        return False
    return callable(getattr(model, "chat_prompt", None)) or getattr(model, "chat_template", None) is not None


def stateful_settings(cls: type, label: str) -> SequenceSettings:
    """A stateful model's ``sequence_batching``, checked: a mistake fails the load, naming the key."""
    given = dict(getattr(cls, "sequence_batching", None) or {})
    unknown = sorted(set(given) - {"strategy", "max_idle_seconds", "max_batch_size", "max_queue_delay_seconds"})
    if unknown:
        raise ServingError(Code.INVALID_ARGUMENT, f"{label}: sequence_batching has unknown keys {unknown}")
    try:
        settings = SequenceSettings(
            strategy=Strategy(given.get("strategy", "oldest")),
            # Longer than Triton's one second: a notebook user steps through a sequence cell by cell.
            max_idle_seconds=float(given.get("max_idle_seconds", 60.0)),
            max_batch_size=int(given.get("max_batch_size", 8)),
            max_queue_delay_seconds=float(given.get("max_queue_delay_seconds", 0.0)),
        )
    except (TypeError, ValueError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"{label}: sequence_batching: {exc}") from None
    if settings.max_batch_size < 1 or settings.max_idle_seconds <= 0 or settings.max_queue_delay_seconds < 0:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"{label}: sequence_batching needs max_batch_size >= 1, max_idle_seconds > 0, max_queue_delay_seconds >= 0",
        )
    controls = dict(getattr(cls, "control_inputs", None) or {})
    if set(controls) - {"START", "END", "READY", "CORRID"}:
        raise ServingError(Code.INVALID_ARGUMENT, f"{label}: control_inputs kinds are START, END, READY and CORRID")
    return settings


def _control_values(controls: Controls) -> dict[str, np.ndarray]:
    """Triton's control inputs for one request: 0/1 flags as int32 [1], the correlation id as int64 or bytes [1]."""
    corrid = controls.correlation_id
    return {
        "START": np.array([int(controls.start)], np.int32),
        "END": np.array([int(controls.end)], np.int32),
        "READY": np.array([int(controls.ready)], np.int32),
        "CORRID": np.array([corrid], np.int64) if isinstance(corrid, int) else np.array([corrid.encode()], object),
    }


def load(name: str, version: int, path: str, policy: LoadPolicy) -> Servable:
    file = Path(path) / MODEL_FILE
    require_python(policy, file)
    module = import_file(file, "model", name, version)
    try:
        cls = model_class(module, file)
        where = f"{cls.__name__} in {file}"
        model_signatures(cls, where)  # declaration errors before any user code runs
        model = call_user(cls, f"Creating {where}")
        load_files = getattr(model, "load", None)
        if callable(load_files):
            call_user(load_files, f"{where}: load({path})", Path(path))
        if chat_model(model):
            return ChatPythonServable(name, version, path, module, model)
        return PythonServable(name, version, path, module, model)
    except BaseException:
        forget_module(module)
        raise


# ------------------------------------------------------------------------------------------ export
def exports(obj: Any) -> bool:
    """Whether ``obj`` is a model class this platform writes (a subclass of :class:`PythonModel`)."""
    return isinstance(obj, type) and issubclass(obj, PythonModel) and obj is not PythonModel


def write(obj: Any, folder: Path, **options: Any) -> None:
    """Write ``model.py`` for the model class ``obj``: its source, and imports for the names it uses.

    The class's own source is written, not its module's (a notebook or a training script does much more than
    define the model); each module-level name the class uses becomes an import, or a constant. Names that can
    be neither (a notebook's variable holding an array) are refused by name. The result is imported back to
    check that it defines the model.
    """
    if options:
        raise ServingError(Code.INVALID_ARGUMENT, f"A Python model takes no export options; got {sorted(options)}")
    if not exports(obj):
        raise ServingError(Code.INVALID_ARGUMENT, f"{obj!r} is not a subclass of workbench.PythonModel")
    file = Path(folder) / MODEL_FILE
    file.write_text(model_source(obj))
    module = import_file(file, "export", obj.__name__, 0)
    try:
        cls = model_class(module, file)
        model_signatures(cls, f"{cls.__name__} in {file}")
    finally:
        forget_module(module)


def model_source(cls: type) -> str:
    source = class_source(cls)
    tree = ast.parse(source)
    lines = [
        f"# model.py written by workbench.export from {cls.__module__}.{cls.__qualname__}",
        "from __future__ import annotations",
        "",
    ]
    namespace = _namespace(cls)
    for name in sorted(_free_names(tree)):
        if name in namespace:
            lines.append(_definition(cls, name, namespace[name]))
    return "\n".join(lines) + "\n\n\n" + source.rstrip() + "\n"


def class_source(cls: type) -> str:
    """The source of ``cls``; for a class defined in a notebook cell, found through its methods' cell."""
    with contextlib.suppress(OSError, TypeError):
        return textwrap.dedent(inspect.getsource(cls))
    for code in _method_codes(cls):
        lines = linecache.getlines(code.co_filename)
        if not lines:
            continue
        text = "".join(lines)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
                end = node.end_lineno or node.lineno
                if node.lineno <= code.co_firstlineno <= end:
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    return textwrap.dedent("".join(lines[start - 1 : end]))
    raise ServingError(
        Code.INVALID_ARGUMENT,
        f"The source of {cls.__qualname__} cannot be found; write its model.py by hand and export the folder",
    )


def _method_codes(cls: type) -> Iterator[types.CodeType]:
    for value in vars(cls).values():
        function = getattr(value, "__func__", value)  # staticmethod, classmethod
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType):
            yield code


def _namespace(cls: type) -> Mapping[str, Any]:
    """The globals the class's methods see (a notebook's namespace for a class defined in a cell)."""
    for value in vars(cls).values():
        function = getattr(value, "__func__", value)
        namespace = getattr(function, "__globals__", None)
        if isinstance(namespace, dict):
            return namespace
    module = inspect.getmodule(cls)
    return vars(module) if module is not None else {}


def _free_names(tree: ast.AST) -> set[str]:
    """Names the source reads but never binds itself (nor are builtins): what its module must provide."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return loaded - bound - set(dir(builtins))


def _definition(cls: type, name: str, value: Any) -> str:
    """One line of model.py that gives ``name`` the value the class saw."""
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if (
        isinstance(module, str)
        and isinstance(qualname, str)
        and module != "__main__"
        and "<" not in qualname
        and "." not in qualname
        and not module.startswith("_workbench_")
    ):
        return f"from {module} import {qualname}" if qualname == name else f"from {module} import {qualname} as {name}"
    with contextlib.suppress(ValueError, SyntaxError, TypeError):
        if ast.literal_eval(repr(value)) == value:
            return f"{name} = {value!r}"
    raise ServingError(
        Code.INVALID_ARGUMENT,
        f'{cls.__qualname__} uses "{name}" ({type(value).__name__}), which cannot be written into model.py: '
        "import it, or define it inside the class (read data files in load(path))",
    )
