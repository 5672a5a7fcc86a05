"""Required literals of a regular expression, for the multi-pattern prefilter.

A scan of a large training log only runs the detailed rules on lines that contain
one of a few literal strings. Those strings are derived from each rule's regex, so
that a rule file stays a regex and nothing else: for a pattern, find a set of
strings such that every match contains at least one of them.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

with warnings.catch_warnings():
    # The standard library's own regex parser: deprecated as a public name since
    # 3.11 (it lives on as re._parser), typed by typeshed under this one.
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_constants
    import sre_parse

#: Literals shorter than this match too often to be worth prefiltering on.
MIN_LITERAL = 3


@dataclass(frozen=True, slots=True)
class Literal:
    text: str
    caseless: bool


_Alternatives = frozenset[Literal] | None  # None: no requirement known


def _score(alternatives: _Alternatives) -> tuple[int, int]:
    """Higher is a better prefilter: long shortest literal, few alternatives."""
    if not alternatives:
        return (-1, 0)
    return (min(len(lit.text) for lit in alternatives), -len(alternatives))


def _best(candidates: list[frozenset[Literal]]) -> _Alternatives:
    usable = [c for c in candidates if c and min(len(lit.text) for lit in c) >= MIN_LITERAL]
    if not usable:
        return None
    return max(usable, key=_score)


def _sequence(items: list[tuple[Any, Any]], caseless: bool) -> _Alternatives:
    candidates: list[frozenset[Literal]] = []
    run: list[str] = []

    def close_run() -> None:
        if run:
            candidates.append(frozenset({Literal("".join(run), caseless)}))
            run.clear()

    for op, av in items:
        if op is sre_constants.LITERAL:
            run.append(chr(av))
            continue
        close_run()
        sub = _node(op, av, caseless)
        if sub:
            candidates.append(sub)
    close_run()
    return _best(candidates)


def _node(op: Any, av: Any, caseless: bool) -> _Alternatives:
    if op is sre_constants.SUBPATTERN:
        _group, add_flags, del_flags, pattern = av
        inner_caseless = caseless
        if add_flags & re.IGNORECASE:
            inner_caseless = True
        if del_flags & re.IGNORECASE:
            inner_caseless = False
        return _sequence(list(pattern), inner_caseless)
    if op is sre_constants.ATOMIC_GROUP:
        return _sequence(list(av), caseless)
    if op is sre_constants.BRANCH:
        _none, branches = av
        union: set[Literal] = set()
        for branch in branches:
            alternatives = _sequence(list(branch), caseless)
            if not alternatives:
                return None
            union |= alternatives
        return frozenset(union)
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT):
        low, _high, pattern = av
        if low >= 1:
            return _sequence(list(pattern), caseless)
        return None
    return None


def required_literals(pattern: str) -> list[Literal] | None:
    """Strings one of which every match of `pattern` contains, or None when unknown.

    Patterns that the standard parser cannot read (syntax only the `regex` module
    knows) return None: such a rule is tried on every line, which is slower but
    never misses.
    """
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError, ValueError):
        return None
    caseless = bool(parsed.state.flags & re.IGNORECASE)
    alternatives = _sequence(list(parsed.data), caseless)
    if alternatives is None:
        return None
    return sorted(alternatives, key=lambda lit: (lit.text, lit.caseless))
