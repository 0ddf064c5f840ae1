"""Which of a model's versions on disk it serves: TF Serving's ``ServableVersionPolicy`` (and Triton's
``version_policy``), read from a model config or a Triton ``config.pbtxt``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal

PolicyKind = Literal["latest", "all", "specific"]


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """Which of the versions found on disk a model should serve (TF Serving's ServableVersionPolicy)."""

    kind: PolicyKind = "latest"
    num_versions: int = 1
    versions: frozenset[int] = frozenset()

    def select(self, on_disk: Iterable[int]) -> set[int]:
        found = sorted(set(on_disk))
        if self.kind == "all":
            return set(found)
        if self.kind == "specific":
            return {v for v in found if v in self.versions}
        return set(found[-self.num_versions :]) if self.num_versions > 0 else set()

    def describe(self) -> str:
        if self.kind == "latest":
            return f"latest({self.num_versions})"
        if self.kind == "specific":
            return f"specific({', '.join(map(str, sorted(self.versions)))})"
        return "all"
