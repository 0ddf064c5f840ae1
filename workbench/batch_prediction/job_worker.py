"""One worker of a batch job run in several processes: ``python -m workbench.batch_prediction.job_worker`` (started by
:func:`workbench.batch_predict` with ``num_workers``), its part of the job on a server of its own.

It reads its job from standard input (JSON: the server's options and the job, with its ``part``) and writes JSON
lines to standard output: ``{"progress": [rows, done, failed, seconds]}`` after each batch, then ``{"summary": {...}}``
or ``{"error": "..."}``. A process of its own, started with the interpreter running the job, rather than through
multiprocessing: nothing of the starting program (a script without a ``__main__`` guard, ``workbench batch``
itself) runs again in it.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from workbench.batch_prediction.job import BatchJob, BatchSummary, Progress
from workbench.batch_prediction.standalone import options_of, run_to_end, standalone
from workbench.runtime import tensorflow_runtime


def main() -> int:
    tensorflow_runtime.mark_server_process()
    spec = json.loads(sys.stdin.read())
    job_fields = spec["job"]
    job = BatchJob(**{**job_fields, "part": tuple(job_fields["part"])})

    def told(now: Progress) -> None:
        print(json.dumps({"progress": [now.rows, now.done, now.failed, now.seconds]}), flush=True)

    try:
        summary: BatchSummary = run_to_end(standalone(options_of(spec["options"]), job, told))
    except Exception as exc:  # noqa: BLE001 - the starting process raises it, in these words
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        print(json.dumps({"error": message}), flush=True)
        return 1
    print(json.dumps({"summary": dataclasses.asdict(summary)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
