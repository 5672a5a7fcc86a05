"""Command line: `triage scan`, `triage patterns check`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .patterns import PatternError, check_examples, load_directory, shipped_patterns_dir


class UsageError(Exception):
    """Bad usage or an unreadable input: exit status 2 with a one-line message."""


def _patterns_check(args: argparse.Namespace) -> int:
    directory = Path(args.directory) if args.directory else shipped_patterns_dir()
    try:
        rules = load_directory(directory)
    except PatternError as error:
        print(f"triage: {error}", file=sys.stderr)
        return 1
    problems = 0
    examples = 0
    for rule in rules:
        examples += len(rule.examples) + len(rule.counter_examples)
        for reason in check_examples(rule):
            problems += 1
            print(f"{rule.file}: rule {rule.id}: {reason}", file=sys.stderr)
    files = len({rule.file for rule in rules})
    status = "ok" if problems == 0 else f"{problems} problem(s)"
    print(f"{directory}: {len(rules)} rules in {files} files, {examples} examples: {status}")
    return 0 if problems == 0 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triage", description=__doc__)
    parser.add_argument("--version", action="version", version=f"triage {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    patterns = commands.add_parser("patterns", help="work with pattern files")
    patterns_commands = patterns.add_subparsers(dest="patterns_command", required=True)
    check = patterns_commands.add_parser("check", help="validate a pattern directory and run its examples")
    check.add_argument("directory", nargs="?", help="directory of *.toml rule files (default: the shipped catalog)")
    check.set_defaults(handler=_patterns_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except UsageError as error:
        print(f"triage: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return status
