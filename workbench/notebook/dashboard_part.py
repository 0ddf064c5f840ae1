"""What every part of the dashboard shares: the kernel's thread for widget changes, background work, closing.

The parts (:mod:`workbench.notebook.widgets` lists them) talk to a server only through its public APIs; their
threads only fetch and compute, and hand every widget change to the kernel's own thread (:func:`on_kernel_thread`).
"""

from __future__ import annotations

import functools
import html
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import ipywidgets as widgets
import requests

from workbench.client import Client
from workbench.core.errors import ServingError
from workbench.notebook.live_figure import LiveFigure

Server = Any  # a ServerHandle, a Client, or a REST base URL

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
log = logging.getLogger(__name__)
T = TypeVar("T")


# ------------------------------------------------------------------------------------ the kernel's thread
# ipywidgets are not thread-safe. A trait change runs its observers and sends its update to the frontend on
# whichever thread makes it, while the kernel's main thread applies the frontend's own messages (a slider
# dragged, a button clicked) to the same widgets: two threads interleaving there lose or reorder updates and
# run observers concurrently. So the parts' background threads only fetch and compute, and hand what they got
# to the kernel's IO loop, the one that handles those comm messages; tornado's ``add_callback`` is its
# thread-safe entry. Outside a kernel (a plain Python process, headless tests) there is no such loop and no
# frontend: changes are then made at once on the calling thread, one at a time.
_without_kernel = threading.RLock()


def _kernel_io_loop() -> Any | None:
    """The IO loop of the ipykernel this process runs, or None when it runs none."""
    try:
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return None
    if not Kernel.initialized():
        return None
    return getattr(Kernel.instance(), "io_loop", None)


def on_kernel_thread(change: Callable[[], None]) -> None:
    """Make ``change`` (which sets widget traits) on the kernel's thread: now if this is it, else queued there."""
    loop = _kernel_io_loop()
    if loop is not None and threading.current_thread() is not threading.main_thread():  # ipykernel: main thread
        loop.add_callback(logged, change)
        return
    with _without_kernel:
        change()


def logged(change: Callable[[], None]) -> None:
    try:
        change()
    except Exception:  # a failed redraw must not take the kernel's loop down with it
        log.exception("updating a workbench widget failed")


class Newest(Generic[T]):
    """Hands values from a background thread to the kernel's thread; a value not applied yet is replaced by a
    newer one, so a kernel busy with a long cell finds one pending update per part, not a backlog."""

    def __init__(self, apply: Callable[[T], None]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._pending: list[T] = []

    def post(self, value: T) -> None:
        with self._lock:
            queued = bool(self._pending)
            self._pending[:] = [value]
        if not queued:
            on_kernel_thread(self._run)

    def _run(self) -> None:
        with self._lock:
            values, self._pending[:] = list(self._pending), []
        for value in values:
            self._apply(value)


def client_of(server: Server) -> Client:
    if isinstance(server, Client):
        return server
    if isinstance(server, str):
        return Client(server)
    return server.client  # a ServerHandle


def set_options(dropdown: widgets.Dropdown, options: list[Any]) -> None:
    """Replace a dropdown's options, keeping its value if still offered, else the first option."""
    values = [o[1] if isinstance(o, tuple) else o for o in options]
    if list(dropdown.options) == list(options):
        return
    current = dropdown.value
    dropdown.options = options
    if values:
        dropdown.value = current if current in values else values[0]


def register(server: Server, part: Part) -> None:
    """Stopping a ServerHandle closes the widgets built on it (their threads would talk to nothing)."""
    register = getattr(server, "on_stop", None)
    if callable(register):
        register(part.close)


class Part:
    """Background-thread bookkeeping shared by every dashboard part."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"workbench-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _run_action(
        self,
        work: Callable[[], Any],
        buttons: list[widgets.Button],
        status: widgets.HTML,
        done: Callable[[Any], None] | None = None,
    ) -> None:
        """Run ``work`` off the kernel's main thread, with the buttons disabled; then show its outcome (``done``
        gets its result) on the kernel's thread."""
        for button in buttons:
            button.disabled = True
        status.value = "<i>working…</i>"

        def finish(result: Any = None, error: Exception | None = None) -> None:
            if error is not None:
                status.value = f'<span style="color:#c00">{html.escape(str(error))}</span>'
            else:
                if done is not None:
                    done(result)
                status.value = '<span style="color:#080">done</span>'
            for button in buttons:
                button.disabled = False

        def run() -> None:
            try:
                result = work()
            except Exception as exc:  # shown where the button was clicked; a bug is logged too
                if not isinstance(exc, (ServingError, requests.RequestException, ValueError)):
                    log.exception("a workbench widget action failed")
                on_kernel_thread(functools.partial(finish, error=exc))
            else:
                on_kernel_thread(functools.partial(finish, result))

        self._threads = [t for t in self._threads if t.is_alive()]
        self._spawn(run, "action")

    @property
    def threads(self) -> list[threading.Thread]:
        return [t for t in self._threads if t.is_alive()]

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(timeout)


class StatsPanel(Part):
    """A dashboard panel drawn from one kind of record in the server's stats snapshot (:attr:`RECORDS`: the
    ``"shadow"`` or ``"drift"`` entry), fetched every ``interval`` seconds on a thread of its own and drawn on the
    kernel's (the newest snapshot only: a slow draw skips the ones it missed). A subclass builds :attr:`widget` and
    its figure (a :class:`~workbench.notebook.live_figure.LiveFigure`, ``_live``), then calls :meth:`_start`; it
    draws in :meth:`_draw`, and keeps what must not be skipped (a series over time) in :meth:`_received`, on the
    polling thread, so a kernel busy with a long cell loses no reading."""

    RECORDS = ""

    def __init__(self, server: Server, interval: float = 1.0) -> None:
        super().__init__()
        self.client = client_of(server)
        self.interval = interval
        # The records the panel shows: set by :meth:`_draw` once its figure and words show them.
        self.records: dict[str, dict[str, Any]] = {}
        self.widget: widgets.Widget
        self._live: LiveFigure

    @property
    def figure(self) -> Any:
        """The panel's plotly ``FigureWidget`` (read it anew: one the browser stopped drawing is replaced)."""
        return self._live.figure

    def _start(self, server: Server) -> None:
        self._updates: Newest[dict[str, dict[str, Any]]] = Newest(self._draw)
        self._spawn(self._poll, f"{self.RECORDS}-panel")
        register(server, self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                snapshot = self.client.stats()
            except (ServingError, requests.RequestException):
                snapshot = {}
            records = snapshot.get(self.RECORDS) if isinstance(snapshot, dict) else None
            records = records if isinstance(records, dict) else {}
            self._received(records)
            self._updates.post(records)
            self._stop.wait(self.interval)

    def _received(self, records: dict[str, dict[str, Any]]) -> None:
        """Each snapshot's records as they arrive (the polling thread's): nothing to keep by default."""

    def _draw(self, records: dict[str, dict[str, Any]]) -> None:
        raise NotImplementedError
