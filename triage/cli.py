"""Command line: `triage scan`, `triage patterns check`."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .engine import Engine
from .patterns import PatternError, check_examples, load_directory, shipped_patterns_dir
from .render import format_text, incident_to_dict
from .scan import InputError, scan


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


def _parse_boot_time(value: str) -> float:
    try:
        moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--boot-time: not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # naive: the local time of this machine
    return moment.timestamp()


def _load_engine(pattern_dirs: Sequence[str]) -> Engine:
    for directory in pattern_dirs:
        if not Path(directory).is_dir():
            raise UsageError(f"--patterns: not a directory: {directory}")
    try:
        # A one-shot scan compiles the shipped rules as it uses them (start-up time).
        return Engine.load([Path(d) for d in pattern_dirs], validate_shipped=False)
    except PatternError as error:
        raise UsageError(str(error)) from None


def _scan(args: argparse.Namespace) -> int:
    if not args.kernel and not args.log:
        raise UsageError("scan: give at least one --kernel FILE or --log FILE")
    boot_time = _parse_boot_time(args.boot_time) if args.boot_time else None
    engine = _load_engine(args.patterns)
    try:
        result = scan(engine, args.kernel, args.log, boot_time=boot_time, one_window=args.one_window)
    except InputError as error:
        raise UsageError(str(error)) from None
    if args.format == "json":
        document = {
            "incidents": [incident_to_dict(incident) for incident in result.incidents],
            "clock": {"mode": result.clock, "note": result.clock_note},
            "inputs": [{"path": r.path, "kind": r.kind, **r.stats} for r in result.inputs],
        }
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        sys.stdout.write(format_text(result.incidents, colour=colour))
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Run the daemon (imports kept here: `triage scan` need not load the web stack)."""
    import logging

    from .config import DEFAULT_CONFIG_PATH, ConfigError, apply_overrides, load_config, validate
    from .service import Daemon

    path = Path(args.config) if args.config else None
    overrides = {
        "listen": args.listen,
        "state_dir": args.state_dir,
        "watch": args.watch or None,
        "kernel_source": args.kernel_source,
        "patterns": args.patterns or None,
    }
    overrides = {key: value for key, value in overrides.items() if value is not None}
    try:
        config = apply_overrides(load_config(path), **overrides)
        validate(config)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    logging.basicConfig(
        level=getattr(logging, str(config.log_level).upper(), logging.INFO),
        format="%(levelname)s %(name)s: %(message)s",  # journald adds the time
        stream=sys.stderr,
    )
    reload_path = path if path is not None else (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None)
    try:
        return Daemon(config, config_path=reload_path, overrides=overrides).run()
    except OSError as error:  # a port in use, an unreadable state directory: say so, no traceback
        print(f"triage: {error}", file=sys.stderr)
        return 1


def _alert_test(args: argparse.Namespace) -> int:
    """Send one clearly marked test message to a configured sink and say what it answered."""
    from .alerts.formats import redact
    from .alerts.responses import Delivered, Retry
    from .alerts.worker import send_test
    from .config import ConfigError, load_config

    try:
        config = load_config(Path(args.config) if args.config else None)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    sink = config.alerts.sink(args.sink)
    if sink is None:
        known = ", ".join(s.name for s in config.alerts.sinks) or "none configured"
        raise UsageError(f"alert test: no sink named {args.sink!r} in [[alerts.sinks]] ({known})")
    outcome = send_test(sink, node=config.alerts.node, base_url=config.alerts_base_url)
    where = ", ".join(redact(url) for url in sink.targets)
    if isinstance(outcome, Delivered):
        print(f"{sink.name} ({sink.kind}, {where}): delivered")
        return 0
    verdict = "failed, would retry" if isinstance(outcome, Retry) else "failed permanently"
    print(f"{sink.name} ({sink.kind}, {where}): {verdict}: {outcome.reason}")
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triage", description=__doc__)
    parser.add_argument("--version", action="version", version=f"triage {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    scan_parser = commands.add_parser(
        "scan",
        help="triage saved logs offline",
        description="Correlate saved kernel and training logs into labelled incidents.",
    )
    scan_parser.add_argument(
        "--kernel",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE",
        help="kernel log: dmesg, dmesg -T, journalctl (short*, json, export), kern.log or a /dev/kmsg dump; "
        "- for stdin; .gz ok",
    )
    scan_parser.add_argument(
        "--log",
        action="extend",
        nargs="+",
        default=[],
        metavar="FILE",
        help="training log (torchrun, DeepSpeed, LLaMA-Factory output); - for stdin; .gz ok",
    )
    scan_parser.add_argument(
        "--boot-time", metavar="ISO8601", help="when the node booted, to put dmesg stamps on the wall clock"
    )
    scan_parser.add_argument(
        "--patterns", action="append", default=[], metavar="DIR", help="extra rule directory (overrides by rule id)"
    )
    scan_parser.add_argument("--format", choices=("text", "json"), default="text")
    scan_parser.add_argument(
        "--one-window",
        action="store_true",
        help="the logs share no clock: correlate everything in them as one time window",
    )
    scan_parser.set_defaults(handler=_scan)

    serve = commands.add_parser(
        "serve",
        help="run the daemon: tail the kernel log and training logs, serve incidents over HTTP",
        description="Tail the kernel log and training logs, keep incidents in SQLite, serve them over HTTP.",
    )
    serve.add_argument("--config", metavar="FILE", help="TOML configuration (default /etc/triage/triage.toml)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="HTTP address (default 127.0.0.1:8750)")
    serve.add_argument("--state-dir", metavar="DIR", help="where the SQLite store lives")
    serve.add_argument(
        "--watch", action="append", default=[], metavar="GLOB", help="training log glob (repeatable; replaces)"
    )
    serve.add_argument("--kernel-source", choices=("auto", "kmsg", "journal", "both", "none"))
    serve.add_argument(
        "--patterns", action="append", default=[], metavar="DIR", help="extra rule directory (repeatable)"
    )
    serve.set_defaults(handler=_serve)

    alert = commands.add_parser("alert", help="alert sinks")
    alert_commands = alert.add_subparsers(dest="alert_command", required=True)
    alert_test = alert_commands.add_parser("test", help="send a test message to one configured sink")
    alert_test.add_argument("sink", metavar="SINK-NAME", help="the name of an [[alerts.sinks]] entry")
    alert_test.add_argument("--config", metavar="FILE", help="TOML configuration (default /etc/triage/triage.toml)")
    alert_test.set_defaults(handler=_alert_test)

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
    except (UsageError, PatternError) as error:
        print(f"triage: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return status
