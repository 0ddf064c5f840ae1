"""The model analyzer: which batching settings and how many workers serve a model best, measured, not guessed.

``workbench analyze MODEL --model_base_path DIR`` (Python: :func:`analyze`; notebook: ``%serve analyze``): every
candidate configuration is served by a ``workbench serve`` of its own and loaded as perf_analyzer loads a server
(:mod:`workbench.client.perf`); the winner is the one that serves most within the constraints, written as the files
the server reads. :mod:`.candidates` says what is swept, :mod:`.sweep` measures, :mod:`.choice` picks and explains,
:mod:`.report` writes the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Bound on first use (PEP 562), as workbench's own face: the command line reads the analyzer's flags
# (:mod:`.analyze_flags`) without importing numpy and the load generator.
if TYPE_CHECKING:
    from workbench.analyzer.analysis import analyze
    from workbench.analyzer.candidates import Candidate
    from workbench.analyzer.choice import Analysis, Constraints

__all__ = ["Analysis", "Candidate", "Constraints", "analyze"]


def __getattr__(name: str) -> Any:
    if name == "analyze":
        from workbench.analyzer.analysis import analyze

        return analyze
    if name == "Candidate":
        from workbench.analyzer.candidates import Candidate

        return Candidate
    if name in ("Analysis", "Constraints"):
        from workbench.analyzer import choice

        return getattr(choice, name)
    raise AttributeError(f"module 'workbench.analyzer' has no attribute {name!r}")
