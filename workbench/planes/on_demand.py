"""Requests for a version that is not in memory (evicted, or never loaded under ``--load_on_demand``) wait for it.

The request claims the version (:meth:`~workbench.models.budgeted_loads.BudgetedLoads.claim`): that loads it,
evicting the least recently used idle versions if the memory budget must, and keeps it from eviction until the
request holds it. The wait is bounded like a first load's (:mod:`workbench.planes.first_load_waits`): by the
request's deadline (DEADLINE_EXCEEDED) and ``--wait_for_model_load_seconds`` (UNAVAILABLE). A version that cannot
fit the budget is answered with its RESOURCE_EXHAUSTED error; any other load failure is left to resolution, which
says NOT_FOUND with the load's error, as for a version that failed at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib

from workbench.core.errors import Code, ServingError
from workbench.models.budgeted_loads import BudgetedLoads
from workbench.models.harness import Harness
from workbench.planes.calls import ModelSpec

# A claimed version is never evicted, so one claim nearly always ends holding it; a few more cover a version dropped
# and put back by a management change while the request waited.
_CLAIMS = 3


async def hold_on_demand(
    loads: BudgetedLoads, spec: ModelSpec, timeout: float | None, wait_limit: float
) -> Harness | None:
    """The servable ``spec`` names, loaded if it must be and acquired for the request; None when ``spec`` names
    nothing that could load (resolution then answers, NOT_FOUND or INVALID_ARGUMENT)."""
    harness = loads.resident(spec.name, spec.version, spec.label, spec.key)
    if harness is not None:
        return harness
    loop = asyncio.get_running_loop()
    bound = wait_limit if timeout is None else min(timeout, wait_limit)
    deadline = loop.time() + bound
    for _ in range(_CLAIMS):
        claim = loads.claim(spec.name, spec.version, spec.label)
        if claim is None:
            return None
        try:
            settled: asyncio.Future[None] = loop.create_future()

            def wake(settled: asyncio.Future[None] = settled) -> None:  # a manager thread, under its lock
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                    loop.call_soon_threadsafe(_settle, settled)

            if loads.when_claim_settled(claim, wake):
                try:
                    await asyncio.wait_for(settled, max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    raise _waited_too_long(spec.name, claim[1], timeout, wait_limit) from None
            error = loads.claim_error(claim)
            if error is not None:
                raise error
            harness = loads.resident(spec.name, spec.version, spec.label, spec.key)
            if harness is not None:
                return harness
        finally:
            loads.release_claim(claim)
    return None


def _settle(settled: asyncio.Future[None]) -> None:
    if not settled.done():  # a request that gave up cancelled it
        settled.set_result(None)


def _waited_too_long(name: str, version: int, timeout: float | None, wait_limit: float) -> ServingError:
    if timeout is not None and timeout <= wait_limit:
        return ServingError(
            Code.DEADLINE_EXCEEDED,
            f"Version {version} of model {name} is loading on demand: the request's deadline passed first",
        )
    return ServingError(
        Code.UNAVAILABLE,
        f"Version {version} of model {name} is still loading on demand after {wait_limit:g}s "
        "(--wait_for_model_load_seconds)",
    )
