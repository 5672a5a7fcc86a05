"""deploy/: the systemd unit verifies and carries what the daemon needs; the sysusers line is sound."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "deploy" / "triage.service"
SYSUSERS = REPO / "deploy" / "triage.sysusers"
INSTALLED = "/usr/local/bin/triage"


def directives(section: str) -> dict[str, list[str]]:
    """Each directive of a unit section with all its values (systemd allows repeats)."""
    values: dict[str, list[str]] = {}
    current = None
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def venv_triage() -> str:
    found = shutil.which("triage", path=str(Path(sys.executable).parent)) or shutil.which("triage")
    if found is None:
        pytest.skip("no triage executable installed (pip install -e .)")
    return found


def verify(tmp_path: Path, text: str) -> tuple[int, list[str], str]:
    """`systemd-analyze verify` on `text` with ExecStart at this venv's real triage (verify needs it to exist).

    Returns the exit status, the lines that complain about our unit, and the whole output.
    systemd-analyze exits 0 on many mistakes (a bad value is "ignoring"), so the lines matter too.
    """
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (deploy/install-system-deps.sh test)")
    assert text.count(f"ExecStart={INSTALLED} ") == 1
    unit = tmp_path / "triage.service"
    unit.write_text(text.replace(f"ExecStart={INSTALLED} ", f"ExecStart={venv_triage()} "), encoding="utf-8")
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    # Only an unknown user or group may be reported: sysusers has not run on a test machine.
    tolerated = re.compile(r"(failed to resolve|no such|unknown) (user|group)", re.I)
    problems = [line for line in output.splitlines() if "triage.service" in line and not tolerated.search(line)]
    return result.returncode, problems, output


def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    status, problems, output = verify(tmp_path, UNIT.read_text(encoding="utf-8"))
    assert status == 0, output
    assert problems == [], output


@pytest.mark.parametrize(
    ("before", "after"),
    [("Type=notify", "Type=notifyy"), ("WatchdogSec=30", "WatchdogSec=thirty"), ("Nice=10", "Nicety=10")],
)
def test_verify_catches_a_broken_unit(tmp_path: Path, before: str, after: str) -> None:
    """The check above can fail: a mistake in a directive is a complaint about our unit."""
    text = UNIT.read_text(encoding="utf-8")
    assert before in text
    _, problems, output = verify(tmp_path, text.replace(before, after))
    assert problems, output


def test_unit_parses_as_ini() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text(encoding="utf-8"))
    assert set(parser.sections()) == {"Unit", "Service", "Install"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Type", "notify"),
        ("ExecStart", f"{INSTALLED} serve --config /etc/triage/triage.toml"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("WatchdogSec", "30"),
        ("Restart", "on-failure"),
        ("RestartSec", "2"),
        ("DynamicUser", "no"),
        ("User", "triage"),
        ("Group", "triage"),
        ("SupplementaryGroups", "systemd-journal adm"),
        ("AmbientCapabilities", "CAP_SYSLOG"),
        ("CapabilityBoundingSet", "CAP_SYSLOG"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("StateDirectory", "triage"),
        ("ProtectHome", "read-only"),
        ("PrivateTmp", "yes"),
        ("Nice", "10"),
        ("CPUWeight", "20"),
        ("IOSchedulingClass", "idle"),
        ("MemoryMax", "512M"),
    ],
)
def test_unit_has_the_required_directives(key: str, value: str) -> None:
    assert directives("Service").get(key) == [value]


@pytest.mark.parametrize("key", ["ProtectKernelLogs", "PrivateDevices", "ProtectClock", "DeviceAllow", "DevicePolicy"])
def test_unit_keeps_dev_kmsg_visible(key: str) -> None:
    """These hide /dev/kmsg (ProtectClock and DeviceAllow through the device policy they imply)."""
    assert key not in directives("Service")


def test_unit_says_why_and_where_from() -> None:
    text = UNIT.read_text(encoding="utf-8")
    assert re.search(r"#.*ln -s \S+/bin/triage /usr/local/bin/triage", text)
    assert re.search(r"#.*ProtectKernelLogs.*PrivateDevices", text)
    assert re.search(r"#.*/dev/kmsg", text)
    assert re.search(r"#.*training job", text)
    assert directives("Install") == {"WantedBy": ["multi-user.target"]}


def test_sysusers_line() -> None:
    lines = [line for line in SYSUSERS.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert lines == ['u triage - "GPU triage daemon" /var/lib/triage']


def test_sysusers_creates_the_user(tmp_path: Path) -> None:
    """systemd-sysusers, run against an empty root, writes the user and group the unit names."""
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        pytest.skip("systemd-sysusers is not installed")
    (tmp_path / "etc").mkdir()
    result = subprocess.run([sysusers, f"--root={tmp_path}", str(SYSUSERS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    assert re.search(r"^triage:x:\d+:\d+:GPU triage daemon:/var/lib/triage:", passwd, re.M), passwd
    assert re.search(r"^triage:x:\d+:", (tmp_path / "etc" / "group").read_text(), re.M)


AMTOOL = shutil.which("amtool")


@pytest.mark.skipif(AMTOOL is None, reason="amtool (Debian prometheus-alertmanager) is not installed")
def test_the_fleet_alertmanager_example_is_valid_and_routes_by_level() -> None:
    config = str(REPO / "deploy" / "alertmanager.yml")
    assert AMTOOL is not None
    check = subprocess.run([AMTOOL, "check-config", config], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 inhibit rules" in check.stdout

    def route(*labels: str) -> str:
        done = subprocess.run(
            [AMTOOL, "config", "routes", "test", f"--config.file={config}", *labels],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip()

    assert route("alertname=GPUTriageIncident", "level=driver", "category=gpu_reset") == "node-oncall"
    assert route("alertname=GPUTriageIncident", "level=code", "category=oom") == "platform-chat"
