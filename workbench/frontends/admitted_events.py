"""Server-sent events answering requests the data plane already admitted, whose work began in their handler (an
OpenAI chat's choices, a v2 ``generate_stream``): the answer's status tells a refusal before the stream starts, and
whatever happens to the stream afterwards (it ended, failed, its client left, it never started), its events are
closed, which ends the work read or not, and then its requests end, counted by how the stream ended."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from workbench.core.errors import Code, ServingError
from workbench.planes.calls import RequestInFlight
from workbench.planes.decoupled import Begun

EVENT_STREAM = "text/event-stream; charset=utf-8"


class Outcome:
    """How a streamed answer ended, for its requests' counts: finished, failed (``error``), or left by its client.
    The events set it: ``error`` where they sent an error event, ``finished`` once they sent their last."""

    def __init__(self) -> None:
        self.finished = False
        self.error: BaseException | None = None

    def exit(self, calls: Sequence[RequestInFlight]) -> None:
        error = self.error
        if error is None and not self.finished:
            error = ServingError(Code.CANCELLED, "The client left before the answer ended")
        for call in calls:
            call.__exit__(type(error) if error is not None else None, error, None)


class AdmittedEvents(StreamingResponse):
    """``events`` for admitted ``calls``: closed, then the calls ended by ``outcome``, however the stream ends."""

    def __init__(
        self,
        events: Begun[bytes],
        calls: Sequence[RequestInFlight],
        outcome: Outcome,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(events, media_type=EVENT_STREAM, headers=headers)
        self._events, self._calls, self._outcome = events, calls, outcome

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()
            self._outcome.exit(self._calls)
