"""Which of the repository's models the server serves, and whether clients may change that: Triton's model control.

``--model_control_mode`` takes Triton's three modes, and workbench's own when it is not given:

- (not given) every model of the config or repository serves; the repository is polled
  (``--file_system_poll_wait_seconds``) for new models and versions; the v2 repository API loads and unloads
  *versions* (a whole model leaves with the config). What workbench has always done.
- ``none``: every model loads at start-up; the repository is read once; load and unload requests are refused.
- ``poll``: every model loads at start-up; the repository is polled for new models and versions; load and unload
  requests are refused.
- ``explicit``: only the ``--load_model`` models load at start-up (``*``: all); the repository is read only when a
  load asks; clients load and unload whole models (``unload_dependents`` takes the pipelines built on one along).

Refusals use Triton's words, which its clients and users match on. The server asks :meth:`ModelControl.select`
which of a repository's models to serve, so the source, the start-up and a load all agree.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Sequence

from workbench.engine.options import ModelConfig
from workbench.errors import Code, ServingError

ALL_MODELS = "*"


class ControlMode(enum.Enum):
    VERSIONS = ""  # workbench's own: the repository decides the models, clients the versions
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, text: str) -> ControlMode:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"--model_control_mode takes none, poll or explicit, not {text!r}"
            ) from None


def check_load_models(mode: ControlMode, names: Sequence[str]) -> None:
    """``--load_model`` only means something in explicit mode, and ``*`` stands alone (as in Triton)."""
    if names and mode is not ControlMode.EXPLICIT:
        raise ServingError(Code.INVALID_ARGUMENT, "--load_model needs --model_control_mode=explicit")
    if ALL_MODELS in names and len(names) > 1:
        raise ServingError(Code.INVALID_ARGUMENT, "--load_model=* loads every model: give it alone")


class ModelControl:
    """The models a server serves out of its repository, and the load and unload requests that change them.

    ``discover()`` lists the repository's models (None: the models come from a config file); ``apply(configs)``
    realises exactly ``configs`` (loading what is new, unloading what went) and returns once their versions settled.
    Thread-safe: loads and unloads take turns.
    """

    def __init__(
        self,
        mode: ControlMode,
        discover: Callable[[], list[ModelConfig]] | None,
        apply: Callable[[list[ModelConfig]], None],
        load_models: Sequence[str] = (),
    ) -> None:
        check_load_models(mode, load_models)
        if mode is ControlMode.EXPLICIT and discover is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "--model_control_mode=explicit loads models out of a repository: give --model_repository",
            )
        self.mode = mode
        self._discover = discover
        self._apply = apply
        self._everything = ALL_MODELS in load_models
        self._loaded: set[str] = set() if self._everything else set(load_models)
        self._unloaded: set[str] = set()  # unloaded by request: listed by the index as such
        self._lock = threading.Lock()
        self._changing = threading.Lock()  # one load or unload at a time, as Triton serialises them

    @property
    def explicit(self) -> bool:
        return self.mode is ControlMode.EXPLICIT

    # ------------------------------------------------------------------------------------------ selection
    def select(self, found: Iterable[ModelConfig]) -> list[ModelConfig]:
        """Of the repository's models, those to serve: all of them, unless loading is explicit."""
        found = list(found)
        if not self.explicit:
            return found
        with self._lock:
            if self._everything:  # --load_model=*: every model found at start-up, then as loads and unloads say
                self._loaded = {c.name for c in found}
                self._everything = False
            return [c for c in found if c.name in self._loaded]

    def discover(self) -> list[ModelConfig]:
        """The models to serve now, from a fresh listing of the repository."""
        assert self._discover is not None
        return self.select(self._discover())

    def unloaded(self) -> list[str]:
        """Models unloaded by request and not loaded since (the repository index lists them as UNAVAILABLE)."""
        with self._lock:
            return sorted(self._unloaded)

    def not_loaded(self, served: Iterable[str]) -> list[str]:
        """The repository's models that do not serve (explicit mode lists them in the index, without a state)."""
        if not self.explicit or self._discover is None:
            return []
        serving = set(served)
        return sorted(c.name for c in self._discover() if c.name not in serving)

    # --------------------------------------------------------------------------------------------- changes
    def refuse_unless_explicit(self) -> None:
        if self.mode in (ControlMode.NONE, ControlMode.POLL):
            raise ServingError(Code.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")

    def load(self, name: str) -> None:
        """Serve ``name`` from the repository (re-reading it when it already serves); raises Triton's
        "failed to load" when the repository has no such model."""
        with self._changing:
            found = self._discover() if self._discover is not None else []
            if name not in {c.name for c in found}:
                raise ServingError(
                    Code.NOT_FOUND,
                    f"failed to load '{name}', failed to poll from model repository: it has no folder {name!r}",
                )
            with self._lock:
                self._loaded.add(name)
                self._unloaded.discard(name)
            self._apply(self.select(found))

    def unload(self, names: Iterable[str]) -> None:
        """Stop serving ``names`` (a model and, when asked, its dependents); returns once they unloaded."""
        names = set(names)
        with self._changing:
            with self._lock:
                self._loaded -= names
                self._unloaded |= names
            self._apply(self.discover())
