"""``--memory_budget``, ``--load_on_demand``, ``--unload_after_idle`` and ``--pin``, read and checked.

The budget's text: one or two comma-separated amounts, host memory's and GPU memory's (``gpu:`` first). An amount is
bytes (``4294967296``; Kubernetes' units: ``4Gi``/``4GiB`` powers of 1024, ``4G``/``4GB`` powers of 1000), or a share
of the memory there is: ``0.5`` or ``50%`` (a number with a decimal point, or a percent sign; a plain integer is
bytes). This machine's memory is ``/proc/meminfo``'s, or its cgroup's limit when lower (a container's); the GPUs'
is what PyTorch or ``nvidia-smi`` reports (:mod:`workbench.runtime.memory`). What the budget bounds, and how, is
:mod:`workbench.models.memory_policy`'s.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

from workbench.core.errors import Code, ServingError
from workbench.core.footprint import Footprint, format_bytes


@dataclasses.dataclass(frozen=True)
class Budget:
    """``--memory_budget``: at most ``host`` bytes of host memory and ``gpu`` bytes of GPU memory (None: unbounded)."""

    host: int | None = None
    gpu: int | None = None
    text: str = ""  # as given, for messages

    @property
    def bounded(self) -> bool:
        return self.host is not None or self.gpu is not None

    def holds(self, footprint: Footprint) -> bool:
        return (self.host is None or footprint.host <= self.host) and (self.gpu is None or footprint.gpu <= self.gpu)

    def short(self, footprint: Footprint) -> Footprint:
        """How far ``footprint`` is over the budget, per kind (0 where it fits)."""
        return Footprint(
            max(0, footprint.host - self.host) if self.host is not None else 0,
            max(0, footprint.gpu - self.gpu) if self.gpu is not None else 0,
        )

    def describe(self) -> str:
        parts = [format_bytes(self.host)] if self.host is not None else []
        parts += [f"{format_bytes(self.gpu)} of GPU memory"] if self.gpu is not None else []
        return f"{' and '.join(parts) or 'unbounded'} (--memory_budget={self.text})"


# ------------------------------------------------------------------------------------------ the budget's text
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(%|[a-zA-Z]*)\s*")


def parse_amount(text: str, of_total: Callable[[], int | None], what: str) -> int:
    """One amount of memory: bytes (``4294967296``, ``4Gi``, ``4GiB``, ``500M``: Kubernetes' units, ``Ki Mi Gi Ti``
    powers of 1024, ``K M G T`` powers of 1000), or a share of ``of_total()`` bytes: ``0.5`` or ``50%`` (a number
    with a decimal point or a percent sign; a plain integer is bytes)."""
    match = _AMOUNT.fullmatch(text)
    if match is None:
        raise ServingError(Code.INVALID_ARGUMENT, f"--memory_budget: {text!r} is not an amount of memory")
    number, unit = match.group(1), match.group(2).lower()
    if unit == "%" or (not unit and "." in number):
        share = float(number) / (100 if unit == "%" else 1)
        if not 0 < share <= 1:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"--memory_budget: {text!r} is a share of {what}, from 0 (excluded) to 1 (100%)"
            )
        whole = of_total()
        if whole is None:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"--memory_budget: {text!r} is a share of {what}, which this machine does not tell: give bytes instead",
            )
        return int(whole * share)
    if unit not in _UNITS:
        raise ServingError(
            Code.INVALID_ARGUMENT, f"--memory_budget: unknown unit {match.group(2)!r} in {text!r} (Ki, Mi, Gi, K, M, G)"
        )
    amount = float(number) * _UNITS[unit]
    if amount < 1 or not math.isfinite(amount):
        raise ServingError(Code.INVALID_ARGUMENT, f"--memory_budget: {text!r} is no memory at all")
    return int(amount)


def parse_budget(
    text: str, *, ram: Callable[[], int | None] = lambda: None, gpu: Callable[[], int | None] = lambda: None
) -> Budget:
    """``--memory_budget``: one or two comma-separated amounts, host memory's and GPU memory's (``gpu:`` first).

    ``8Gi``: 8 GiB of host memory; ``0.5``: half of this machine's (``ram()``: its memory, or its cgroup's limit if
    lower); ``gpu:0.8``: 80 % of the GPUs' memory (``gpu()``); ``4Gi,gpu:20Gi``: both. "" bounds nothing.
    """
    host: int | None = None
    device: int | None = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part.lower().startswith("gpu:"):
            if device is not None:
                raise ServingError(Code.INVALID_ARGUMENT, f"--memory_budget={text}: GPU memory is given twice")
            device = parse_amount(part[4:], gpu, "the GPUs' memory")
        else:
            if host is not None:
                raise ServingError(Code.INVALID_ARGUMENT, f"--memory_budget={text}: host memory is given twice")
            host = parse_amount(part, ram, "this machine's memory")
    return Budget(host, device, text.strip())


# -------------------------------------------------------------------------------------------------------- pins
@dataclasses.dataclass(frozen=True)
class PinRule:
    """``--pin MODEL`` (every version of it) or ``--pin MODEL:VERSION``."""

    model: str
    version: int | None = None

    @classmethod
    def parse(cls, text: str) -> PinRule:
        name, sep, version = text.strip().rpartition(":")
        if sep and version.isdigit() and name:
            return cls(name, int(version))
        if not text.strip():
            raise ServingError(Code.INVALID_ARGUMENT, "--pin needs a model name (MODEL or MODEL:VERSION)")
        return cls(text.strip())

    def covers(self, model: str, version: int) -> bool:
        return self.model == model and self.version in (None, version)


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """The flags, read: ``budget`` (``--memory_budget``), ``load_on_demand``, ``unload_after_idle`` seconds (0:
    never), ``pins`` (``--pin``)."""

    budget: Budget = Budget()
    load_on_demand: bool = False
    unload_after_idle: float = 0.0
    pins: tuple[PinRule, ...] = ()

    @classmethod
    def of(cls, budget: str, load_on_demand: bool, unload_after_idle: float, pins: Sequence[str]) -> MemoryOptions:
        """From the flags' values; a malformed one raises ServingError (INVALID_ARGUMENT) saying why."""
        from workbench.runtime.memory import gpu_memory, machine_memory

        if unload_after_idle < 0:
            raise ServingError(Code.INVALID_ARGUMENT, "--unload_after_idle cannot be negative (0: never)")
        return cls(
            parse_budget(budget, ram=machine_memory, gpu=gpu_memory),
            load_on_demand,
            unload_after_idle,
            tuple(PinRule.parse(p) for p in pins),
        )

    @property
    def active(self) -> bool:
        """Whether versions leave memory and come back when asked for (else: TF Serving's behaviour, every aspired
        version loaded)."""
        return self.budget.bounded or self.load_on_demand or self.unload_after_idle > 0
