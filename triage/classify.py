"""Which rule names a piece of text: the pure decision both parsers share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import regex

from . import taxonomy
from .patterns import Rule


@dataclass(frozen=True, slots=True)
class Classification:
    rule: Rule
    match: regex.Match[str]

    @property
    def fields(self) -> dict[str, str]:
        """Named groups of the match that captured something (pid, device, address...)."""
        return {name: value for name, value in self.match.groupdict().items() if value}


def _preference(rule: Rule, order: int) -> tuple[int, bool, int, int]:
    # Higher priority first, follow-ons last, then the taxonomy's order, then load order.
    return (-rule.priority, rule.follow_on, taxonomy.category_rank(rule.category), order)


def matching_rules(rules: Sequence[Rule], text: str, context: str = "") -> list[Classification]:
    """Every rule that matches `text` (and whose context regex, if any, matches
    `text` or the lines before it), best first."""
    lowered = text.lower()
    found: list[tuple[tuple[int, bool, int, int], Classification]] = []
    for order, rule in enumerate(rules):
        if not rule.could_match(text, lowered):
            continue
        match = rule.search(text)
        if match is None:
            continue
        if rule.context is not None and not (rule.context_ok(text) or (context and rule.context_ok(context))):
            continue
        found.append((_preference(rule, order), Classification(rule, match)))
    found.sort(key=lambda item: item[0])
    return [classification for _, classification in found]


def best_rule(rules: Sequence[Rule], text: str, context: str = "") -> Classification | None:
    """The rule that names `text`, or None when no rule matches."""
    found = matching_rules(rules, text, context)
    return found[0] if found else None
