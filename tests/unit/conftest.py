"""The unit tier: in-process, on fakes, no framework, no sockets (``make test-fast``).

When a run collects only this tier, it fails if TensorFlow was imported: a unit test that pulls the framework in
(directly or through an import of the package) is a wire test in disguise, and the tier would stop being fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    items = getattr(session, "items", [])
    only_units = bool(items) and all(UNIT in Path(str(item.fspath)).resolve().parents for item in items)
    if only_units and "tensorflow" in sys.modules and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print("\nthe unit tier imported tensorflow: a unit test must not need a framework", file=sys.stderr)
