"""The rules in force, compiled once for every input: what scan and serve share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .logscan import build_prefilter, build_stamp_finder
from .model import KernelEvent
from .patterns import Catalog, Rule, load_catalog
from .prefilter import Prefilter


@dataclass(slots=True)
class Engine:
    """A loaded catalog with its program-log prefilter built."""

    catalog: Catalog
    kernel_rules: list[Rule] = field(init=False)
    program_rules: list[Rule] = field(init=False)
    prefilter: Prefilter = field(init=False)
    stamp_finder: Prefilter = field(init=False)
    _hints: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.kernel_rules = self.catalog.for_source("kernel")
        self.program_rules = self.catalog.for_source("program")
        self.prefilter = build_prefilter(self.program_rules)
        self.stamp_finder = build_stamp_finder()
        self._hints = {rule.id: rule.hint for rule in self.catalog.rules}

    @classmethod
    def load(
        cls, extra_dirs: Iterable[Path] = (), shipped: Path | None = None, *, validate_shipped: bool = True
    ) -> Engine:
        return cls(load_catalog(extra_dirs, shipped, validate_shipped=validate_shipped))

    def fill_hints(self, events: Sequence[KernelEvent]) -> None:
        """Give each kernel event the hint of the rule that named it."""
        for event in events:
            if not event.hint:
                event.hint = self._hints.get(event.rule_id, "")
