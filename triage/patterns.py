"""The pattern catalog: rules loaded from TOML files, validated, and matched safely.

A rule file is data (node-problem-detector style): each `[[rule]]` has an id, a
source (`kernel` or `program`), a regex, a category from the taxonomy, a title, a
hint for the person on call, and examples that must and must not match. Regexes
are compiled with `regex` and matched with a timeout, so a catastrophic user
pattern costs one skipped match, never a hung daemon.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from . import taxonomy
from .literals import Literal, required_literals

#: Seconds one regex may run on one text before it counts as no match.
MATCH_TIMEOUT = 0.05

SOURCES = ("kernel", "program")
ROLES = ("start", "detail")

_REQUIRED = ("id", "source", "regex", "category", "title", "hint", "match")
_OPTIONAL = (
    "no_match",
    "context",
    "priority",
    "follow_on",
    "group",
    "role",
    "prefilter",
)
_ID_RE = regex.compile(r"^[a-z0-9][a-z0-9_.\-]*$")


class PatternError(ValueError):
    """A rule file that cannot be used: names the file, the rule and the reason."""

    def __init__(self, file: str, rule_id: str | None, reason: str) -> None:
        self.file = file
        self.rule_id = rule_id
        self.reason = reason
        where = f"{file}: rule {rule_id}" if rule_id else file
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """One pattern: a regex and what a match of it means.

    Regexes compile on first use (a scan touches few program rules), or at load
    when the catalog is validated; either way a bad one is a PatternError that
    names the file and the rule.
    """

    id: str
    source: str
    category: str
    title: str
    hint: str
    pattern: str
    file: str
    examples: tuple[str, ...] = ()
    counter_examples: tuple[str, ...] = ()
    #: A second regex that must also match the failure or the lines before it.
    context: str | None = None
    #: Higher wins when several rules match one failure; ties go by category order.
    priority: int = 0
    #: A follow-on names an incident only when nothing else does.
    follow_on: bool = False
    #: Kernel lines of one fault share a group; `detail` lines join the open fault.
    group: str | None = None
    role: str = "start"
    #: Literals one of which every match contains (None: the rule runs on every line).
    literals: tuple[Literal, ...] | None = None
    _regex: regex.Pattern[str] | None = field(default=None, init=False, repr=False)
    _context_regex: regex.Pattern[str] | None = field(default=None, init=False, repr=False)

    @property
    def level(self) -> str:
        return taxonomy.level_of(self.category)

    @property
    def compiled(self) -> regex.Pattern[str]:
        if self._regex is None:
            object.__setattr__(self, "_regex", _compile(self.pattern, self.file, self.id, "regex"))
        assert self._regex is not None
        return self._regex

    @property
    def compiled_context(self) -> regex.Pattern[str] | None:
        if self.context is not None and self._context_regex is None:
            object.__setattr__(self, "_context_regex", _compile(self.context, self.file, self.id, "context"))
        return self._context_regex

    def validate(self) -> None:
        """Compile now: raises PatternError for a bad regex."""
        _ = self.compiled, self.compiled_context

    def search(self, text: str) -> regex.Match[str] | None:
        """The first match in `text`, or None (also when the regex ran out of time)."""
        try:
            return self.compiled.search(text, timeout=MATCH_TIMEOUT)
        except TimeoutError:
            return None

    def context_ok(self, text: str) -> bool:
        context = self.compiled_context
        if context is None:
            return True
        try:
            return context.search(text, timeout=MATCH_TIMEOUT) is not None
        except TimeoutError:
            return False

    def could_match(self, text: str, lowered: str) -> bool:
        """Cheap literal test before the regex: False means the regex cannot match."""
        if self.literals is None:
            return True
        for literal in self.literals:
            if literal.caseless:
                if literal.text.lower() in lowered:
                    return True
            elif literal.text in text:
                return True
        return False


@dataclass(slots=True)
class Catalog:
    """The rules in force, kernel and program ones apart, in load order."""

    rules: list[Rule] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def for_source(self, source: str) -> list[Rule]:
        return [rule for rule in self.rules if rule.source == source]

    def by_id(self, rule_id: str) -> Rule | None:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        return None


def shipped_patterns_dir() -> Path:
    """Where the catalog that comes with triage lives.

    A source checkout (or editable install) keeps it beside the package; a wheel
    installs it under `share/gpu-triage/patterns`; TRIAGE_PATTERNS_DIR overrides both.
    """
    override = os.environ.get("TRIAGE_PATTERNS_DIR")
    if override:
        return Path(override)
    beside = Path(__file__).resolve().parent.parent / "patterns"
    if beside.is_dir():
        return beside
    return Path(sys.prefix) / "share" / "gpu-triage" / "patterns"


def _as_str_list(value: Any, file: str, rule_id: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise PatternError(file, rule_id, f"'{key}' must be a string or a list of strings")
    return tuple(value)


def _compile(pattern: Any, file: str, rule_id: str, key: str) -> regex.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise PatternError(file, rule_id, f"'{key}' must be a non-empty string")
    try:
        return regex.compile(pattern, regex.VERSION0)
    except regex.error as error:
        raise PatternError(file, rule_id, f"bad {key}: {error}") from None


def parse_rule(raw: dict[str, Any], file: str, *, validate: bool = True) -> Rule:
    """Check one `[[rule]]` table and build its Rule (regexes compiled now if `validate`)."""
    rule_id = raw.get("id")
    if not isinstance(rule_id, str) or not _ID_RE.match(rule_id):
        raise PatternError(file, repr(rule_id), "id must be lower-case letters, digits, '.', '_' or '-'")
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise PatternError(file, rule_id, f"unknown key(s): {', '.join(unknown)}")
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise PatternError(file, rule_id, f"missing key(s): {', '.join(missing)}")
    source = raw["source"]
    if source not in SOURCES:
        raise PatternError(file, rule_id, f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    category = raw["category"]
    if not isinstance(category, str) or not taxonomy.is_category(category):
        raise PatternError(file, rule_id, f"unknown category {category!r} (see TAXONOMY.md)")
    for key in ("title", "hint"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise PatternError(file, rule_id, f"'{key}' must be a non-empty string")
    for key in ("regex", "context"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise PatternError(file, rule_id, f"'{key}' must be a non-empty string")
    priority = raw.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PatternError(file, rule_id, "'priority' must be an integer")
    follow_on = raw.get("follow_on", False)
    if not isinstance(follow_on, bool):
        raise PatternError(file, rule_id, "'follow_on' must be true or false")
    role = raw.get("role", "start")
    if role not in ROLES:
        raise PatternError(file, rule_id, f"role must be one of {', '.join(ROLES)}, not {role!r}")
    group = raw.get("group")
    if group is not None and not isinstance(group, str):
        raise PatternError(file, rule_id, "'group' must be a string")
    if role == "detail" and group is None:
        raise PatternError(file, rule_id, "a 'detail' rule needs a 'group' to join")
    examples = _as_str_list(raw["match"], file, rule_id, "match")
    if not examples:
        raise PatternError(file, rule_id, "'match' needs at least one example")
    counter = _as_str_list(raw.get("no_match", []), file, rule_id, "no_match")
    literals: tuple[Literal, ...] | None
    if "prefilter" in raw:
        given = _as_str_list(raw["prefilter"], file, rule_id, "prefilter")
        literals = tuple(Literal(text, caseless=True) for text in given if text)
        if not literals:
            raise PatternError(file, rule_id, "'prefilter' needs at least one non-empty literal")
    else:
        derived = required_literals(raw["regex"])
        literals = tuple(derived) if derived is not None else None
    rule = Rule(
        id=rule_id,
        source=source,
        category=category,
        title=raw["title"].strip(),
        hint=raw["hint"].strip(),
        pattern=raw["regex"],
        file=file,
        examples=examples,
        counter_examples=counter,
        context=raw.get("context"),
        priority=priority,
        follow_on=follow_on,
        group=group,
        role=role,
        literals=literals,
    )
    if validate:
        rule.validate()
    return rule


def load_file(path: Path, *, validate: bool = True) -> list[Rule]:
    """All rules of one TOML file; a bad file raises PatternError naming it."""
    file = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise PatternError(file, None, f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise PatternError(file, None, f"not UTF-8: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise PatternError(file, None, f"bad TOML: {error}") from None
    unknown = sorted(set(data) - {"rule"})
    if unknown:
        raise PatternError(file, None, f"unknown top-level key(s): {', '.join(unknown)}")
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise PatternError(file, None, "'rule' must be an array of tables ([[rule]])")
    return [parse_rule(table, file, validate=validate) for table in tables]


def pattern_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise PatternError(str(directory), None, "not a directory")
    return sorted(directory.glob("*.toml"))


def load_directory(directory: Path, *, validate: bool = True) -> list[Rule]:
    """The rules of every `*.toml` in a directory; ids must be unique across it."""
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for path in pattern_files(directory):
        for rule in load_file(path, validate=validate):
            if rule.id in seen:
                raise PatternError(rule.file, rule.id, f"duplicate id (also in {seen[rule.id]})")
            seen[rule.id] = rule.file
            rules.append(rule)
    return rules


def merge(base: Iterable[Rule], overrides: Iterable[Rule]) -> list[Rule]:
    """Rules of `overrides` replace those of `base` with the same id, or are added."""
    merged: dict[str, Rule] = {rule.id: rule for rule in base}
    for rule in overrides:
        merged[rule.id] = rule
    return list(merged.values())


def load_catalog(
    extra_dirs: Iterable[Path] = (), shipped: Path | None = None, *, validate_shipped: bool = True
) -> Catalog:
    """The shipped catalog with user directories layered on top, by rule id.

    User directories are always validated in full. The shipped catalog is checked
    by its own tests (`triage patterns check`), so a one-shot scan may skip
    compiling its regexes up front (`validate_shipped=False`) and compile on use.
    """
    base_dir = shipped if shipped is not None else shipped_patterns_dir()
    rules = load_directory(base_dir, validate=validate_shipped)
    files = [str(path) for path in pattern_files(base_dir)]
    for directory in extra_dirs:
        rules = merge(rules, load_directory(directory))
        files.extend(str(path) for path in pattern_files(directory))
    return Catalog(rules=rules, files=files)


def check_examples(rule: Rule) -> Iterator[str]:
    """Reasons the rule's own examples disagree with it (none when it is right)."""
    for example in rule.examples:
        if rule.search(example) is None:
            yield f"example does not match: {example!r}"
        elif not rule.context_ok(example):
            yield f"example does not match the context regex: {example!r}"
        elif not rule.could_match(example, example.lower()):
            yield f"prefilter literals miss the example: {example!r}"
    for example in rule.counter_examples:
        if rule.search(example) is not None and rule.context_ok(example):
            yield f"counter-example matches: {example!r}"
