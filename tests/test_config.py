"""triage serve's configuration: defaults, errors that name the key, overrides, the shipped example."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from triage import config as config_module
from triage.config import (
    Config,
    ConfigError,
    apply_overrides,
    is_loopback,
    load_config,
    parse_config,
    validate,
)
from triage.store import default_state_dir

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "deploy" / "triage.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "triage.toml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    return str(caught.value)


# -- defaults -------------------------------------------------------------------------


def test_no_file_at_the_default_path_gives_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")
    config = load_config(None)
    assert config == Config()
    assert config.server.listen == "127.0.0.1:8750" and config.server.token == ""
    assert config.server.address == ("127.0.0.1", 8750) and config.server.url == "http://127.0.0.1:8750"
    assert config.state.dir == default_state_dir()
    assert (config.state.retention_days, config.state.max_incidents) == (30.0, 10000)
    assert (config.kernel.source, config.kernel.previous_boot) == ("auto", True)
    assert config.logs.watch == ("/var/log/training/**/*.log",)
    assert (config.logs.existing_from_end, config.logs.rescan_interval, config.logs.quiet_flush) == (True, 5.0, 0.2)
    assert config.patterns.dirs == ("/etc/triage/patterns",)
    assert config.correlation.horizon_hours == 2.0
    assert config.log_level == "info"
    validate(config)  # the default patterns dir may be missing


def test_state_dir_default_follows_the_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert Config().state.dir == tmp_path / "state" / "triage"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert Config().state.dir == Path("/var/lib/triage")


def test_an_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == Config()


def test_a_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"absent\.toml: no such file"):
        load_config(tmp_path / "absent.toml")


def test_a_directory_or_binary_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)


def test_values_are_read(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
log_level = "DEBUG"
[server]
listen = "[::1]:9000"
base_url = "https://triage.example.org/"
[state]
dir = "/srv/triage"
retention_days = 7.5
max_incidents = 50
[kernel]
source = "journal"
previous_boot = false
[logs]
watch = ["/data/runs/**/*.log", "/tmp/x.log"]
existing_from_end = false
rescan_interval = 2
quiet_flush = 0.5
[patterns]
dirs = []
[correlation]
horizon_hours = 0.5
""",
    )
    config = load_config(path)
    assert config.log_level == "debug"
    assert config.server.address == ("::1", 9000)
    assert config.server.url == "https://triage.example.org"
    assert config.state == config_module.StateConfig(dir=Path("/srv/triage"), retention_days=7.5, max_incidents=50)
    assert config.kernel == config_module.KernelConfig(source="journal", previous_boot=False)
    assert config.logs.watch == ("/data/runs/**/*.log", "/tmp/x.log")
    assert (config.logs.existing_from_end, config.logs.rescan_interval, config.logs.quiet_flush) == (False, 2.0, 0.5)
    assert config.patterns.dirs == ()
    assert config.correlation.horizon_hours == 0.5


# -- errors that name the key ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[server]\nlisten = "abc"', 'triage.toml: server.listen: expected HOST:PORT, got "abc"'),
        ('[server]\nlisten = "127.0.0.1"', 'server.listen: expected HOST:PORT, got "127.0.0.1"'),
        ('[server]\nlisten = "::1:8750"', 'server.listen: expected HOST:PORT, got "::1:8750"'),
        ('[server]\nlisten = "[nothex]:8750"', "server.listen: expected [IPV6]:PORT"),
        ('[server]\nlisten = "[]:8750"', "server.listen: expected [IPV6]:PORT"),
        ('[server]\nlisten = "[127.0.0.1]:8750"', "server.listen: expected [IPV6]:PORT"),
        ('[server]\nlisten = ""', 'server.listen: expected HOST:PORT, got ""'),
        ('[server]\nlisten = "127.0.0.1:0"', "server.listen: expected a port from 1 to 65535"),
        ('[server]\nlisten = "127.0.0.1:70000"', "server.listen: expected a port from 1 to 65535"),
        ('[server]\nlisten = "h:p"', 'server.listen: expected HOST:PORT, got "h:p"'),
        ("[server]\nlisten = 8750", "server.listen: expected a string, got 8750 (integer)"),
        (
            '[server]\nbase_url = "triage.local"',
            'server.base_url: expected an http:// or https:// URL, got "triage.local"',
        ),
        ("[server]\ntoken = 5", "server.token: expected a string"),
        ("[state]\nretention_days = 0", "state.retention_days: expected a positive number, got 0 (integer)"),
        ("[state]\nretention_days = -1.5", "state.retention_days: expected a positive number, got -1.5 (float)"),
        ("[state]\nretention_days = nan", "state.retention_days: expected a positive number, got nan (float)"),
        ('[state]\nretention_days = "30"', 'state.retention_days: expected a positive number, got "30"'),
        ("[state]\nmax_incidents = true", "state.max_incidents: expected a positive integer, got true (boolean)"),
        ("[state]\nmax_incidents = 10.5", "state.max_incidents: expected a positive integer, got 10.5 (float)"),
        ("[state]\ndir = 3", "state.dir: expected a directory path, got 3 (integer)"),
        ('[state]\ndir = ""', 'state.dir: expected a directory path, got ""'),
        ('[kernel]\nsource = "dmesg"', 'kernel.source: expected one of auto, kmsg, journal, both, none, got "dmesg"'),
        ('[kernel]\nprevious_boot = "yes"', 'kernel.previous_boot: expected true or false, got "yes"'),
        (
            '[logs]\nwatch = "/var/log/*.log"',
            'logs.watch: expected an array of non-empty strings, got "/var/log/*.log"',
        ),
        ('[logs]\nwatch = ["a", 1]', 'logs.watch: expected an array of non-empty strings, got ["a", 1] (array)'),
        ('[logs]\nwatch = [""]', 'logs.watch: expected an array of non-empty strings, got [""] (array)'),
        ("[logs]\nrescan_interval = 0", "logs.rescan_interval: expected a positive number"),
        ("[logs]\nquiet_flush = inf", "logs.quiet_flush: expected a positive number, got inf (float)"),
        ("[logs]\nexisting_from_end = 1", "logs.existing_from_end: expected true or false, got 1 (integer)"),
        ('[patterns]\ndirs = "/etc/triage/patterns"', "patterns.dirs: expected an array of non-empty strings"),
        ("[correlation]\nhorizon_hours = 0", "correlation.horizon_hours: expected a positive number"),
        ('log_level = "verbose"', 'log_level: expected one of debug, info, warning, error, got "verbose"'),
        ("server = 1", "server: expected a table [server], got 1 (integer)"),
        ('logs = "x"', 'logs: expected a table [logs], got "x"'),
        ("[state]\ndir = 2024-01-01", "state.dir: expected a directory path, got"),
    ],
)
def test_bad_values_name_the_key(text: str, expected: str) -> None:
    assert expected in error_of(text)
    assert error_of(text).startswith("triage.toml: ")


def test_the_token_is_never_quoted() -> None:
    message = error_of('[server]\ntoken = "has a space-SECRETVALUE"')
    assert message.startswith("triage.toml: server.token: expected printable ASCII without spaces")
    assert "SECRETVALUE" not in message
    config = parse_config('[server]\ntoken = "SECRETVALUE"')
    assert "SECRETVALUE" not in repr(config) and "SECRETVALUE" not in str(config.server)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[server]\nlisen = "x"', "unknown key server.lisen in [server] (known: base_url, listen, token)"),
        ('[server]\nlisen = "x"\nfoo = 1', "unknown keys server.foo, server.lisen in [server]"),
        ('listen = "127.0.0.1:1"', "unknown key listen in the top level (known: alerts, correlation, kernel"),
        ("[alerts]\nurl = 1", "unknown key alerts.url in [alerts]"),
        ("[logs.extra]\nx = 1", "unknown key logs.extra in [logs]"),
    ],
)
def test_unknown_keys_are_errors(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server\nlisten = 1")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not valid TOML: "):
        load_config(path)


def test_errors_name_the_file_given(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nlisten = "abc"')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f'{path}: server.listen: expected HOST:PORT, got "abc"'


# -- validate ---------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:8750", "[::]:8750", "10.1.2.3:8750", "node17:8750", "[2001:db8::1]:80"])
def test_listening_beyond_loopback_needs_a_token(listen: str) -> None:
    config = parse_config(f'[server]\nlisten = "{listen}"')
    with pytest.raises(ConfigError, match=r"^server\.listen: .* set server\.token"):
        validate(config)
    validate(parse_config(f'[server]\nlisten = "{listen}"\ntoken = "0123456789abcdef"'))


@pytest.mark.parametrize("listen", ["127.0.0.1:8750", "127.0.0.2:1", "localhost:8750", "[::1]:8750", "LOCALHOST:80"])
def test_loopback_needs_no_token(listen: str) -> None:
    validate(parse_config(f'[server]\nlisten = "{listen}"'))


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("example.org")


def test_wildcard_listen_links_by_host_name() -> None:
    import socket

    config = parse_config('[server]\nlisten = "0.0.0.0:8750"\ntoken = "t"')
    assert config.server.url == f"http://{socket.gethostname()}:8750"


def test_pattern_dirs_given_must_exist(tmp_path: Path) -> None:
    validate(parse_config(f'[patterns]\ndirs = ["{tmp_path}"]'))
    with pytest.raises(ConfigError, match=r"patterns\.dirs: .*/absent: no such directory"):
        validate(parse_config(f'[patterns]\ndirs = ["{tmp_path}/absent"]'))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"patterns\.dirs: .*/file: is not a directory"):
        validate(parse_config(f'[patterns]\ndirs = ["{tmp_path}/file"]'))


def test_state_dir_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"state\.dir: .*/file: is not a directory"):
        validate(parse_config(f'[state]\ndir = "{tmp_path}/file"'))
    validate(parse_config(f'[state]\ndir = "{tmp_path}/not-yet"'))  # created at start


# -- overrides ----------------------------------------------------------------------------


def test_flags_override_the_file(tmp_path: Path) -> None:
    base = parse_config('[logs]\nwatch = ["/a/*.log"]\n[patterns]\ndirs = ["/p1"]\n[kernel]\nsource = "kmsg"')
    config = apply_overrides(
        base,
        listen="[::1]:9999",
        state_dir=tmp_path,
        watch=["./logs/**/*.log", "/b/*.log"],
        kernel_source="none",
        patterns=[tmp_path / "mine"],
    )
    assert config.server.address == ("::1", 9999)
    assert config.state.dir == tmp_path
    assert config.logs.watch == ("./logs/**/*.log", "/b/*.log")  # replaces
    assert config.kernel.source == "none"
    assert config.patterns.dirs == ("/p1", str(tmp_path / "mine"))  # appends
    assert base.logs.watch == ("/a/*.log",)  # the original is untouched (frozen)
    assert apply_overrides(base) == base


def test_overrides_keep_other_settings() -> None:
    base = parse_config('[server]\ntoken = "t0k"\n[state]\nmax_incidents = 5')
    config = apply_overrides(base, listen="0.0.0.0:1")
    assert config.server.token == "t0k" and config.state.max_incidents == 5
    validate(config)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"listen": "abc"}, '--listen: expected HOST:PORT, got "abc"'),
        ({"listen": "1.2.3.4:0"}, "--listen: expected a port from 1 to 65535"),
        ({"kernel_source": "dmesg"}, '--kernel-source: expected one of auto, kmsg, journal, both, none, got "dmesg"'),
        ({"watch": [""]}, "--watch: expected an array of non-empty strings"),
        ({"state_dir": ""}, '--state-dir: expected a directory path, got ""'),
    ],
)
def test_bad_flags_name_the_flag(flags: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(Config(), **flags)  # type: ignore[arg-type]
    assert str(caught.value) == expected or str(caught.value).startswith(expected)


def test_listen_flag_without_token_is_refused_by_validate() -> None:
    with pytest.raises(ConfigError, match=r"set server\.token"):
        validate(apply_overrides(Config(), listen="0.0.0.0:8750"))


# -- the shipped example ------------------------------------------------------------------


def test_shipped_example_loads_validates_and_is_the_defaults() -> None:
    config = load_config(SHIPPED)
    validate(config)
    assert config == Config()


def test_shipped_example_shows_every_key() -> None:
    """Each setting of the schema appears in deploy/triage.toml, set or commented, in its section."""
    text = SHIPPED.read_text(encoding="utf-8")
    sections = re.split(r"^\[(\w+)\]$", text, flags=re.M)
    by_section = {"": sections[0]} | dict(zip(sections[1::2], sections[2::2], strict=True))
    for item in dataclasses.fields(Config):
        if "parse" in item.metadata:
            assert re.search(rf"^#? ?{item.name} = ", by_section[""], re.M), item.name
            continue
        section = getattr(Config(), item.name)
        assert item.name in by_section, item.name
        for key in dataclasses.fields(section):
            text = by_section[item.name]
            if "tables" in key.metadata:  # an array of tables: a commented [[section.key]] example
                assert f"# [[{item.name}.{key.name}]]" in text, f"{item.name}.{key.name}"
                for sub in dataclasses.fields(key.metadata["tables"]):
                    assert re.search(rf"^# {sub.name} = ", text, re.M), f"{item.name}.{key.name}.{sub.name}"
                    assert re.search(rf"`{sub.name}`", text), f"{item.name}.{key.name}.{sub.name} explained"
                continue
            assert re.search(rf"^#? ?{key.name} = ", text, re.M), f"{item.name}.{key.name}"
            assert "\n# " in text  # and it is explained


# -- [alerts] ---------------------------------------------------------------------------

SLACK = "https://hooks.slack.com/services/T000/B000/TOKENSLACK123"
SINK = f'[[alerts.sinks]]\nname = "chat"\nkind = "slack"\nurl = "{SLACK}"\n'


def test_alerts_defaults() -> None:
    alerts = Config().alerts
    assert alerts.base_url == "" and Config().alerts_base_url == Config().server.url == "http://127.0.0.1:8750"
    assert alerts.node == config_module.socket.gethostname()
    assert (alerts.labels, alerts.job_from_path, alerts.sinks) == ((), "", ())
    assert (alerts.digest_window, alerts.update_interval, alerts.alertmanager_repeat) == (10.0, 60.0, 60.0)
    assert parse_config("[alerts]\n") == Config()


def test_alerts_values_are_read() -> None:
    config = parse_config(
        '[alerts]\nbase_url = "https://triage.example/"\nnode = "n17"\n'
        'labels = { cluster = "east", rack = "r12" }\njob_from_path = "/shared/logs/{job}/rank{rank}.log"\n'
        "digest_window = 5\nupdate_interval = 30\nalertmanager_repeat = 45\n"
        + SINK
        + 'min_level = "driver"\ncategories = ["gpu_hang"]\nexclude_categories = ["nan_loss"]\n'
        + '[[alerts.sinks]]\nname = "lark"\nkind = "feishu"\nurl = "https://open.feishu.cn/hook/abc"\nsecret = "s"\n'
        + '[[alerts.sinks]]\nname = "am"\nkind = "alertmanager"\nurls = ["http://am0:9093", "http://am1:9093"]\n'
    )
    alerts = config.alerts
    assert config.alerts_base_url == "https://triage.example"
    assert (alerts.node, dict(alerts.labels)) == ("n17", {"cluster": "east", "rack": "r12"})
    assert (alerts.digest_window, alerts.update_interval, alerts.alertmanager_repeat) == (5.0, 30.0, 45.0)
    chat, lark, am = alerts.sinks
    assert (chat.name, chat.kind, chat.targets, chat.min_level) == ("chat", "slack", (SLACK,), "driver")
    assert (chat.categories, chat.exclude_categories, chat.per_minute) == (("gpu_hang",), ("nan_loss",), 60.0)
    assert (lark.secret, lark.per_minute, lark.min_level, lark.categories) == ("s", 300.0, "code", ())
    assert am.targets == ("http://am0:9093", "http://am1:9093") and am.per_minute == 60.0
    assert alerts.sink("am") is am and alerts.sink("nope") is None


@pytest.mark.parametrize(("kind", "rate"), [("slack", 60), ("feishu", 300), ("dingtalk", 20), ("wecom", 20),
                                            ("discord", 30), ("teams", 60), ("generic", 60)])  # fmt: skip
def test_rate_per_minute_defaults_per_kind(kind: str, rate: float) -> None:
    sink = parse_config(f'[[alerts.sinks]]\nname = "s"\nkind = "{kind}"\nurl = "https://h/x"\n').alerts.sinks[0]
    assert sink.per_minute == rate
    set_rate = parse_config(
        f'[[alerts.sinks]]\nname = "s"\nkind = "{kind}"\nurl = "https://h/x"\nrate_per_minute = 7\n'
    )
    assert set_rate.alerts.sinks[0].per_minute == 7.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[alerts]\ndigest_window = 0", "alerts.digest_window: expected a positive number, got 0 (integer)"),
        ('[alerts]\nupdate_interval = "1m"', 'alerts.update_interval: expected a positive number, got "1m"'),
        ("[alerts]\nalertmanager_repeat = -1", "alerts.alertmanager_repeat: expected a positive number"),
        ('[alerts]\nbase_url = "ftp://x"', 'alerts.base_url: expected an http:// or https:// URL, got "ftp://x"'),
        ('[alerts]\nnode = ""', "alerts.node: expected a name"),
        ('[alerts]\nlabels = { "9rack" = "a" }', 'alerts.labels: label name "9rack" is not [a-zA-Z_][a-zA-Z0-9_]*'),
        ('[alerts]\nlabels = { "rack-no" = "a" }', 'alerts.labels: label name "rack-no" is not'),
        ("[alerts]\nlabels = { rack = 12 }", "alerts.labels: label rack: expected a string, got 12 (integer)"),
        ('[alerts]\nlabels = { node = "x" }', 'alerts.labels: label "node" is set by triage itself'),
        ('[alerts]\nlabels = "rack=1"', 'alerts.labels: expected a table of string labels, got "rack=1"'),
        ('[alerts]\njob_from_path = "/logs/{rank}.log"', "alerts.job_from_path: expected a path template with {job}"),
        ('[alerts]\njob_from_path = "/logs/{job:>3}.log"', "alerts.job_from_path: {job:>3} is not a {name} field"),
        ('[alerts]\njob_from_path = "/logs/{job"', "alerts.job_from_path: "),
        ("[alerts]\nsinks = 1", "alerts.sinks: expected an array of tables [[alerts.sinks]], got 1 (integer)"),
        ("[alerts.sinks]\nname = 1", "alerts.sinks: expected an array of tables [[alerts.sinks]]"),
        (SINK.replace('"slack"', '"slak"'), "alerts.sinks[0].kind: expected one of slack, mattermost, discord, teams"),
        (SINK.replace('"slack"', '"slak"'), 'alertmanager, got "slak"'),
        (SINK + SINK.replace('"chat"', '"x"').replace('"slack"', '"slak"'), "alerts.sinks[1].kind: expected"),
        (SINK.replace('name = "chat"\n', ""), "alerts.sinks[0].name: required"),
        (SINK.replace('kind = "slack"\n', ""), "alerts.sinks[0].kind: required"),
        (SINK.replace(f'url = "{SLACK}"\n', ""), "alerts.sinks[0].url: required"),
        (SINK.replace('"chat"', '"on call"'), "alerts.sinks[0].name: expected a name of letters, digits"),
        (SINK + 'min_level = "warn"', 'alerts.sinks[0].min_level: expected one of code, driver, got "warn"'),
        (SINK + 'categories = ["gpu_hung"]', 'alerts.sinks[0].categories: unknown category "gpu_hung"'),
        (SINK + 'exclude_categories = "oom"', "alerts.sinks[0].exclude_categories: expected an array"),
        (SINK + "rate_per_minute = 0", "alerts.sinks[0].rate_per_minute: expected a positive number"),
        (SINK + "secret = 5", "alerts.sinks[0].secret: expected a string (the value is not shown)"),
        (SINK + 'urls = ["https://a/b"]', "alerts.sinks[0].urls: set url or urls, not both"),
        (
            SINK.replace(f'url = "{SLACK}"', 'urls = ["https://a/b"]'),
            "alerts.sinks[0].urls: a list of URLs is for kind alertmanager only (this sink is slack); use url",
        ),
        (
            '[[alerts.sinks]]\nname = "am"\nkind = "alertmanager"\n',
            "alerts.sinks[0].url: required (or urls = [...])",
        ),
        (
            '[[alerts.sinks]]\nname = "am"\nkind = "alertmanager"\nurls = []',
            "alerts.sinks[0].urls: expected a non-empty",
        ),
        (SINK + SINK, 'alerts.sinks[1].name: duplicate sink name "chat" (also sinks[0])'),
    ],
)
def test_bad_alert_values_name_the_key_path(text: str, expected: str) -> None:
    message = error_of(text)
    assert message.startswith("triage.toml: ")
    assert expected in message


def test_unknown_keys_in_a_sink_are_errors() -> None:
    message = error_of(SINK + 'webhook = "x"\nchanel = "y"')
    assert "unknown keys alerts.sinks[0].chanel, alerts.sinks[0].webhook in [alerts.sinks[0]]" in message
    assert (
        "(known: categories, exclude_categories, kind, min_level, name, rate_per_minute, secret, url, urls)" in message
    )


@pytest.mark.parametrize(
    "text",
    [
        SINK.replace("https://", "gopher://"),
        SINK.replace("https://", "https:// "),
        SINK.replace(f'url = "{SLACK}"', f'urls = ["{SLACK}"]').replace('"slack"', '"alertmanager"')
        + "[[alerts.sinks]]\nname = 'b'\nkind = 'alertmanager'\n"
        + 'urls = ["http://am/?token=TOKENSLACK123", "ftp://am/TOKENSLACK123"]',
        SINK + 'secret = "TOKENSLACK123 has a space"\nmin_level = 3',
        SINK + SINK.replace(SLACK, SLACK + "?key=TOKENSLACK123"),
    ],
)
def test_webhook_tokens_and_secrets_never_appear_in_errors(text: str) -> None:
    message = error_of(text)
    assert "TOKENSLACK123" not in message
    assert "alerts.sinks[" in message


def test_bad_url_is_shown_redacted() -> None:
    message = error_of(SINK.replace("https://", "gopher://"))
    assert message == (
        'triage.toml: alerts.sinks[0].url: expected an http:// or https:// URL, got "gopher://hooks.slack.com/services/T0***"'
    )


def test_secrets_and_urls_never_appear_in_repr() -> None:
    config = parse_config(
        SINK
        + 'secret = "SECRETVALUE"\n[[alerts.sinks]]\nname = "am"\nkind = "alertmanager"\n'
        + 'urls = ["http://u:PASSWORD@am0:9093/TOKENPATHPART", "http://am1:9093/?access_token=QUERYTOKEN"]\n'
    )
    for text in (repr(config), str(config), repr(config.alerts), repr(config.alerts.sinks)):
        for secret in ("SECRETVALUE", "TOKENSLACK123", "PASSWORD", "TOKENPATHPART", "QUERYTOKEN"):
            assert secret not in text, secret
    assert "secret='***'" in repr(config.alerts.sinks[0])
    assert "hooks.slack.com" in repr(config) and "am1:9093" in repr(config)  # redacted, not hidden


def test_the_sinks_example_of_the_shipped_file_loads_when_uncommented() -> None:
    text = SHIPPED.read_text(encoding="utf-8")
    example = text[text.index("# [[alerts.sinks]]") :]
    uncommented = "\n".join(line.removeprefix("# ").removeprefix("#") for line in example.splitlines())
    config = parse_config(text + "\n" + uncommented)
    assert [(sink.name, sink.kind, len(sink.targets)) for sink in config.alerts.sinks] == [
        ("oncall-slack", "slack", 1),
        ("infra-feishu", "feishu", 1),
        ("alertmanager", "alertmanager", 2),
    ]
    assert config.alerts.sinks[1].secret
