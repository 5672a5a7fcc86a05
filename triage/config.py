"""`triage serve` configuration: one TOML file, every setting defaulted, validated at start.

The schema is the dataclasses below: each section is a frozen dataclass whose fields
carry their parser in `metadata["parse"]`, and `Config` lists the sections (and the
top-level scalars). Loading walks that table, so a new section (`[alerts]`) is a new
dataclass and one field of `Config`, with no new loader code. Errors name the file
and the key and say what is wrong, because a daemon that starts with a typo in its
config silently ignored is worse than one that refuses to start.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import re
import socket
import string
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .alerts.formats import BUILDERS, redact
from .store import default_state_dir
from .taxonomy import CATEGORIES

DEFAULT_CONFIG_PATH = Path("/etc/triage/triage.toml")
DEFAULT_LISTEN = "127.0.0.1:8750"
DEFAULT_PATTERNS_DIR = "/etc/triage/patterns"
KERNEL_SOURCES = ("auto", "kmsg", "journal", "both", "none")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Messages a minute a sink may send when `rate_per_minute` is not set (the platforms' own limits).
DEFAULT_RATE_PER_MINUTE = {"slack": 60.0, "feishu": 300.0, "dingtalk": 20.0, "wecom": 20.0, "discord": 30.0}
OTHER_RATE_PER_MINUTE = 60.0
#: Labels every alert carries already (Alertmanager's stable set): a static label may not shadow them.
RESERVED_LABELS = ("alertname", "node", "level", "category", "device", "fingerprint", "job")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and key."""


Parse = Callable[[Any], Any]


class _Bad(ValueError):
    """What a parser says is wrong with a value; the loader adds file and key."""


# -- value parsers (pure: raw TOML value -> typed value, or _Bad) ----------------


def _show(value: Any) -> str:
    """A value as the message quotes it, spelled the TOML way, with its type unless it is a string."""
    if isinstance(value, str):
        return json.dumps(value)
    kind = {bool: "boolean", int: "integer", float: "float", list: "array", dict: "table"}.get(type(value))
    finite = not isinstance(value, float) or math.isfinite(value)
    text = json.dumps(value, default=str) if finite else str(value)  # nan, inf: as TOML spells them
    return f"{text} ({kind})" if kind else f"{text} ({type(value).__name__})"


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _Bad(f"expected a string, got {_show(value)}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"expected true or false, got {_show(value)}")
    return value


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Bad(f"expected a positive integer, got {_show(value)}")
    return value


def _positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise _Bad(f"expected a positive number, got {_show(value)}")
    return float(value)


def _choice(*choices: str) -> Parse:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise _Bad(f"expected one of {', '.join(choices)}, got {_show(value)}")
        return value.lower()

    return parse


def _string_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise _Bad(f"expected an array of non-empty strings, got {_show(value)}")
    return tuple(value)


def _path(value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise _Bad(f"expected a directory path, got {_show(value)}")
    return Path(value).expanduser()


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT` -> (host without brackets, port); _Bad when it is neither."""
    match = re.fullmatch(r"\[([^\]]*)\]:(\d{1,5})|([^\s:\[\]]+):(\d{1,5})", value)
    if match is None:
        raise _Bad(f"expected HOST:PORT, got {_show(value)}")
    bracketed = match.group(2) is not None
    host = match.group(1) if bracketed else match.group(3)
    port = int(match.group(2) if bracketed else match.group(4))
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Bad(f"expected [IPV6]:PORT, got {_show(value)}: not an IPv6 address") from None
    if not 1 <= port <= 65535:
        raise _Bad(f"expected a port from 1 to 65535, got {_show(value)}")
    return host, port


def _listen(value: Any) -> str:
    parse_listen(_string(value))
    return str(value)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a name other than localhost counts as reachable)."""
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _token(value: Any) -> str:
    # Never quote the token in a message: it is a secret.
    if not isinstance(value, str):
        raise _Bad("expected a string")
    if value and not re.fullmatch(r"[!-~]+", value):
        raise _Bad("expected printable ASCII without spaces (the value is not shown)")
    return value


def _base_url(value: Any) -> str:
    text = _string(value)
    if text and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise _Bad(f"expected an http:// or https:// URL, got {_show(value)}")
    return text.rstrip("/")


def _webhook_url(value: Any) -> str:
    # A webhook URL carries its token: a message shows it redacted, never whole.
    if not isinstance(value, str):
        raise _Bad(f"expected an http:// or https:// URL, got {_show(value)}")
    if not re.fullmatch(r"https?://[^\s/?#]+(/\S*)?", value):
        raise _Bad(f"expected an http:// or https:// URL, got {json.dumps(redact(value))}")
    return value


def _webhook_urls(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        shown = "a table" if isinstance(value, dict) else _show(value) if not isinstance(value, str) else "a string"
        raise _Bad(f"expected a non-empty array of http:// or https:// URLs, got {shown}")
    for index, item in enumerate(value):
        try:
            _webhook_url(item)
        except _Bad as error:
            raise _Bad(f"item {index}: {error}") from None
    return tuple(value)


def _secret(value: Any) -> str:
    # Never quote the secret in a message.
    if not isinstance(value, str):
        raise _Bad("expected a string (the value is not shown)")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
        raise _Bad(f"expected a name of letters, digits, '_', '.' and '-', got {_show(value)}")
    return value


def _categories(value: Any) -> tuple[str, ...]:
    slugs = _string_list(value)
    unknown = [slug for slug in slugs if slug not in CATEGORIES]
    if unknown:
        plural = "ies" if len(unknown) > 1 else "y"
        raise _Bad(f"unknown categor{plural} {', '.join(map(json.dumps, unknown))} (see TAXONOMY.md)")
    return slugs


def _labels(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise _Bad(f"expected a table of string labels, got {_show(value)}")
    for name, text in value.items():
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name):
            raise _Bad(f"label name {json.dumps(name)} is not [a-zA-Z_][a-zA-Z0-9_]*")
        if name in RESERVED_LABELS:
            raise _Bad(f"label {json.dumps(name)} is set by triage itself (reserved: {', '.join(RESERVED_LABELS)})")
        if not isinstance(text, str):
            raise _Bad(f"label {name}: expected a string, got {_show(text)}")
    return tuple(sorted(value.items()))


def template_fields(template: str) -> tuple[str, ...]:
    """The `{name}` fields of a path template, in order; ValueError when it is malformed."""
    names: list[str] = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or spec or conversion:
            shown = name + ("!" + conversion if conversion else "") + (":" + spec if spec else "")
            raise ValueError(f"{{{shown}}} is not a {{name}} field")
        names.append(name)
    return tuple(names)


def _job_template(value: Any) -> str:
    text = _string(value)
    if not text:
        return text
    try:
        names = template_fields(text)
    except ValueError as error:
        raise _Bad(f"{error} in {_show(value)}") from None
    if "job" not in names:
        raise _Bad(
            f'expected a path template with {{job}}, like "/shared/logs/{{job}}/rank{{rank}}.log", got {_show(value)}'
        )
    return text


def _optional_rate(value: Any) -> float | None:
    return _positive_number(value)


def _setting(
    default: Any,
    parse: Parse,
    *,
    factory: Callable[[], Any] | None = None,
    repr: bool = True,
    required: bool = False,
) -> Any:
    """A dataclass field that carries its parser: the schema is the dataclasses themselves."""
    metadata: dict[str, Any] = {"parse": parse, "required": required}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata, repr=repr)
    return field(default=default, metadata=metadata, repr=repr)


def _tables(kind: type) -> Any:
    """A field that is an array of tables (`[[section.name]]`), each one a `kind` dataclass."""
    return field(default_factory=tuple, metadata={"tables": kind})


class _Invalid(Exception):
    """What a `check()` of a built table finds wrong across its keys: the key (relative) and why."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


# -- the schema -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str = _setting(DEFAULT_LISTEN, _listen)
    #: Bearer token the HTTP API asks for (all but /healthz); "" = none, only allowed on loopback.
    token: str = _setting("", _token, repr=False)  # a secret: kept out of repr, logs and tracebacks
    #: Where links to incidents point (alerts); "" = derived from `listen`.
    base_url: str = _setting("", _base_url)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) to bind, the host without IPv6 brackets."""
        return parse_listen(self.listen)

    @property
    def url(self) -> str:
        """`base_url`, or http://HOST:PORT from `listen` (this host's name for a wildcard address)."""
        if self.base_url:
            return self.base_url
        host, port = self.address
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True, slots=True)
class StateConfig:
    dir: Path = _setting(None, _path, factory=default_state_dir)  # noqa: RUF009 - a field(), not a default value
    retention_days: float = _setting(30.0, _positive_number)
    max_incidents: int = _setting(10000, _positive_int)


@dataclass(frozen=True, slots=True)
class KernelConfig:
    source: str = _setting("auto", _choice(*KERNEL_SOURCES))
    previous_boot: bool = _setting(True, _boolean)
    journal_directory: str = _setting("", _string)


@dataclass(frozen=True, slots=True)
class LogsConfig:
    watch: tuple[str, ...] = _setting(("/var/log/training/**/*.log",), _string_list)
    existing_from_end: bool = _setting(True, _boolean)
    rescan_interval: float = _setting(5.0, _positive_number)
    quiet_flush: float = _setting(0.2, _positive_number)


@dataclass(frozen=True, slots=True)
class PatternsConfig:
    dirs: tuple[str, ...] = _setting((DEFAULT_PATTERNS_DIR,), _string_list)


@dataclass(frozen=True, slots=True)
class CorrelationConfig:
    horizon_hours: float = _setting(2.0, _positive_number)


@dataclass(frozen=True, slots=True)
class SinkConfig:
    """One `[[alerts.sinks]]`: where alerts go, in which platform's shape, and which ones."""

    name: str = _setting("", _name, required=True)
    kind: str = _setting("", _choice(*BUILDERS), required=True)
    #: The webhook (or Alertmanager) URL: it carries a token, so repr and messages redact it.
    url: str = _setting("", _webhook_url, repr=False)
    #: Alertmanager only: every instance of a cluster, each posted to (never through a balancer).
    urls: tuple[str, ...] = _setting((), _webhook_urls, repr=False)
    secret: str = _setting("", _secret, repr=False)
    min_level: str = _setting("code", _choice("code", "driver"))
    categories: tuple[str, ...] = _setting((), _categories)
    exclude_categories: tuple[str, ...] = _setting((), _categories)
    rate_per_minute: float | None = _setting(None, _optional_rate)

    def check(self) -> None:
        """What one key cannot tell: a URL is set, and a list of URLs only for Alertmanager."""
        if self.url and self.urls:
            raise _Invalid("urls", "set url or urls, not both")
        if self.urls and self.kind != "alertmanager":
            raise _Invalid("urls", f"a list of URLs is for kind alertmanager only (this sink is {self.kind}); use url")
        if not self.url and not self.urls:
            raise _Invalid("url", "required" + (" (or urls = [...])" if self.kind == "alertmanager" else ""))

    @property
    def targets(self) -> tuple[str, ...]:
        """The URLs to post each alert to."""
        return self.urls or (self.url,)

    @property
    def per_minute(self) -> float:
        """Messages a minute this sink may send: `rate_per_minute`, else the platform's default."""
        if self.rate_per_minute is not None:
            return self.rate_per_minute
        return DEFAULT_RATE_PER_MINUTE.get(self.kind, OTHER_RATE_PER_MINUTE)

    def __repr__(self) -> str:
        return (
            f"SinkConfig(name={self.name!r}, kind={self.kind!r}, "
            f"targets={tuple(redact(url) for url in self.targets if url)!r}, "
            f"secret={'***' if self.secret else ''!r}, min_level={self.min_level!r}, "
            f"categories={self.categories!r}, exclude_categories={self.exclude_categories!r}, "
            f"rate_per_minute={self.rate_per_minute!r})"
        )


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    #: Where links to incidents point; "" = the daemon's own address (server.url).
    base_url: str = _setting("", _base_url)
    #: The node name alerts carry; default this host's name.
    node: str = _setting(None, _name, factory=socket.gethostname)
    #: Static labels every alert carries (cluster, rack), as sorted (name, value) pairs.
    labels: tuple[tuple[str, str], ...] = _setting((), _labels)
    #: Path template whose fields (`{job}`, `{rank}`) are read from a failing log's path; "" = none.
    job_from_path: str = _setting("", _job_template)
    digest_window: float = _setting(10.0, _positive_number)
    update_interval: float = _setting(60.0, _positive_number)
    alertmanager_repeat: float = _setting(60.0, _positive_number)
    resolve_after: float = _setting(900.0, _positive_number)
    sinks: tuple[SinkConfig, ...] = _tables(SinkConfig)

    def check(self) -> None:
        seen: dict[str, int] = {}
        for index, sink in enumerate(self.sinks):
            if sink.name in seen:
                raise _Invalid(
                    f"sinks[{index}].name",
                    f"duplicate sink name {json.dumps(sink.name)} (also sinks[{seen[sink.name]}])",
                )
            seen[sink.name] = index

    def sink(self, name: str) -> SinkConfig | None:
        return next((sink for sink in self.sinks if sink.name == name), None)


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `triage serve` can be told. Sections are dataclasses; scalars carry a parser."""

    server: ServerConfig = field(default_factory=ServerConfig)
    state: StateConfig = field(default_factory=StateConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    patterns: PatternsConfig = field(default_factory=PatternsConfig)
    correlation: CorrelationConfig = field(default_factory=CorrelationConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    log_level: str = _setting("info", _choice(*LOG_LEVELS))

    @property
    def alerts_base_url(self) -> str:
        """Where alert links point: alerts.base_url, else the daemon's own address."""
        return self.alerts.base_url or self.server.url


# -- loading --------------------------------------------------------------------


def _section_type(item: dataclasses.Field[Any]) -> type | None:
    """The dataclass of a section field of Config, or None for a top-level scalar."""
    if "parse" in item.metadata or "tables" in item.metadata:
        return None
    factory = item.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


def _build(kind: type, table: dict[str, Any], prefix: str) -> Any:
    """An instance of dataclass `kind` from a TOML table, every key parsed; _KeyError names the key."""
    fields = {item.name: item for item in dataclasses.fields(kind)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        where = f"[{prefix.rstrip('.')}]" if prefix else "the top level"
        names = ", ".join(prefix + name for name in unknown)
        known = ", ".join(sorted(fields))
        raise _KeyError("", f"unknown key{'s' if len(unknown) > 1 else ''} {names} in {where} (known: {known})")
    values: dict[str, Any] = {}
    for name, raw in table.items():
        item = fields[name]
        if "tables" in item.metadata:
            if not isinstance(raw, list) or not all(isinstance(entry, dict) for entry in raw):
                raise _KeyError(prefix + name, f"expected an array of tables [[{prefix + name}]], got {_show(raw)}")
            values[name] = tuple(
                _build(item.metadata["tables"], entry, f"{prefix}{name}[{i}].") for i, entry in enumerate(raw)
            )
            continue
        section = _section_type(item)
        if section is not None:
            if not isinstance(raw, dict):
                raise _KeyError(prefix + name, f"expected a table [{prefix + name}], got {_show(raw)}")
            values[name] = _build(section, raw, f"{prefix}{name}.")
            continue
        try:
            values[name] = item.metadata["parse"](raw)
        except _Bad as error:
            raise _KeyError(prefix + name, str(error)) from None
    missing = [item.name for item in fields.values() if item.metadata.get("required") and item.name not in table]
    if missing:
        raise _KeyError(prefix + missing[0], "required")
    built = kind(**values)
    check = getattr(built, "check", None)
    if check is not None:
        try:
            check()
        except _Invalid as error:
            raise _KeyError(prefix + error.key, error.message) from None
    return built


class _KeyError(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)


def parse_config(text: str, name: str = "triage.toml") -> Config:
    """A Config from TOML text; ConfigError naming `name` and the key when it is wrong."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{name}: not valid TOML: {error}") from None
    try:
        config: Config = _build(Config, table, "")
    except _KeyError as error:
        raise ConfigError(f"{name}: {error}") from None
    return config


def load_config(path: Path | None) -> Config:
    """The config in `path` (None: the default path, which may be absent); ConfigError when it is wrong."""
    explicit = path is not None
    target = path if path is not None else DEFAULT_CONFIG_PATH
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{target}: no such file") from None
        return Config()
    except OSError as error:
        raise ConfigError(f"{target}: cannot read: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{target}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return parse_config(text, str(target))


def apply_overrides(
    config: Config,
    *,
    listen: str | None = None,
    state_dir: str | Path | None = None,
    watch: Sequence[str] | None = None,
    kernel_source: str | None = None,
    patterns: Sequence[str | Path] | None = None,
) -> Config:
    """Command-line flags over the file: `--watch` replaces the globs, `--patterns` adds directories."""

    def check(flag: str, parse: Parse, value: Any) -> Any:
        try:
            return parse(value)
        except _Bad as error:
            raise ConfigError(f"{flag}: {error}") from None

    server, state, kernel, logs, pattern_config = (
        config.server,
        config.state,
        config.kernel,
        config.logs,
        config.patterns,
    )
    if listen is not None:
        server = dataclasses.replace(server, listen=check("--listen", _listen, listen))
    if state_dir is not None:
        state = dataclasses.replace(state, dir=check("--state-dir", _path, str(state_dir)))
    if watch is not None:
        logs = dataclasses.replace(logs, watch=check("--watch", _string_list, list(watch)))
    if kernel_source is not None:
        kernel = dataclasses.replace(kernel, source=check("--kernel-source", _choice(*KERNEL_SOURCES), kernel_source))
    if patterns:
        added = check("--patterns", _string_list, [str(p) for p in patterns])
        pattern_config = dataclasses.replace(pattern_config, dirs=pattern_config.dirs + added)
    return dataclasses.replace(config, server=server, state=state, kernel=kernel, logs=logs, patterns=pattern_config)


def validate(config: Config) -> None:
    """What only the whole config can tell: a token where others can connect, pattern dirs that exist."""
    host, _ = config.server.address
    if not is_loopback(host) and not config.server.token:
        raise ConfigError(
            f"server.listen: {config.server.listen} is reachable from other machines; "
            "set server.token (a bearer token the API will require) to listen there, "
            "or listen on 127.0.0.1"
        )
    for directory in config.patterns.dirs:
        path = Path(directory)
        if path.is_dir() or (directory == DEFAULT_PATTERNS_DIR and not path.exists()):
            continue
        problem = "is not a directory" if path.exists() else "no such directory"
        raise ConfigError(f"patterns.dirs: {directory}: {problem}")
    if config.state.dir.exists() and not config.state.dir.is_dir():
        raise ConfigError(f"state.dir: {config.state.dir}: is not a directory")
