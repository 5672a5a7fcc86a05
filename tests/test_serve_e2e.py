"""`triage serve` end to end, against real parts: a real systemd-journald reading the real
/dev/kmsg, real files, a real HTTP server, a notify socket, signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from triage.store import Commit, Store

from .conftest import REPO
from .support.journald import journald_unusable, private_journald
from .support.kmsg import kmsg_unusable, read_ring, seq_of, write_kmsg

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/train.py", line 88, in <module>\n'
    "    main()\n"
    '  File "/work/train.py", line 61, in main\n'
    "    loss.backward()\n"
    "RuntimeError: HIP error: unspecified launch failure\n"
    "HIP kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
)

needs_kmsg = pytest.mark.skipif(bool(kmsg_unusable()), reason=str(kmsg_unusable()))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unique_device() -> str:
    """A PCI address no other test record uses (the kernel ring outlives test runs)."""
    return f"{int.from_bytes(os.urandom(2), 'big'):04x}:c1:00.0"


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    port: int
    state: Path
    logs: Path
    notify: socket.socket
    stderr: Path
    messages: list[str] = field(default_factory=list)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
            return json.loads(response.read())

    def text(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
            return str(response.read().decode())

    def read_notify(self, timeout: float) -> list[str]:
        self.notify.settimeout(timeout)
        try:
            while True:
                self.messages.append(self.notify.recv(4096).decode())
                self.notify.settimeout(0.01)
        except (TimeoutError, BlockingIOError):
            pass
        return self.messages

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 15.0) -> float:
        """Seconds until GET /incidents satisfies `predicate` (fails the test after `timeout`)."""
        start = time.monotonic()
        while True:
            incidents = self.get("/incidents?limit=1000")["incidents"]
            if predicate(incidents):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"not seen within {timeout} s: {json.dumps(incidents, indent=1)[:3000]}")
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited {self.process.returncode}: {self.stderr.read_text()[-3000:]}")
            time.sleep(0.05)


@contextmanager
def running_daemon(tmp_path: Path, *args: str, name: str = "d") -> Iterator[Daemon]:
    base = tmp_path / name
    (base / "logs").mkdir(parents=True, exist_ok=True)
    notify_path = base / "notify.sock"
    notify_path.unlink(missing_ok=True)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    port = free_port()
    stderr = base / "stderr.log"
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "2000000", "PYTHONUNBUFFERED": "1"}
    env.pop("WATCHDOG_PID", None)
    command = [
        sys.executable,
        "-m",
        "triage",
        "serve",
        "--config",
        str(base / "triage.toml"),
        "--listen",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(tmp_path / "state"),
        "--watch",
        str(base / "logs" / "**" / "*.log"),
        *args,
    ]
    if not (base / "triage.toml").exists():
        (base / "triage.toml").write_text("[logs]\nquiet_flush = 0.3\nrescan_interval = 1.0\n", encoding="utf-8")
    with open(stderr, "ab") as err:
        process = subprocess.Popen(command, cwd=REPO, env=env, stderr=err, stdout=err)
    daemon = Daemon(process, port, tmp_path / "state", base / "logs", notify, stderr)
    try:
        deadline = time.monotonic() + 30
        while "READY=1" not in daemon.read_notify(0.2):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no READY=1: {stderr.read_text()[-3000:]}")
        yield daemon
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        notify.close()


def holding(device: str) -> Callable[[list[dict[str, Any]]], bool]:
    def check(incidents: list[dict[str, Any]]) -> bool:
        return any(device in i["devices"] and i["program_failures"] for i in incidents)

    return check


@pytest.mark.skipif(bool(journald_unusable() or kmsg_unusable()), reason=str(journald_unusable() or kmsg_unusable()))
def test_gpu_reset_in_journald_and_a_traceback_make_one_driver_incident(tmp_path: Path) -> None:
    device = unique_device()
    with private_journald() as journald:
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "triage.toml").write_text(
            f'[kernel]\nsource = "journal"\njournal_directory = "{journald.directory}"\n'
            "[logs]\nquiet_flush = 0.3\nrescan_interval = 1.0\n",
            encoding="utf-8",
        )
        with running_daemon(tmp_path) as daemon:
            # The kernel's own record, as amdgpu prints it; journald takes it from /dev/kmsg.
            write_kmsg(f"<3>amdgpu {device}: amdgpu: GPU reset begin!")
            time.sleep(0.2)
            log = daemon.logs / "job7" / "rank0.log"
            log.parent.mkdir()
            log.write_text(TRACEBACK, encoding="utf-8")
            daemon.wait_for(holding(device))
            incident = next(i for i in daemon.get("/incidents")["incidents"] if device in i["devices"])
            assert (incident["level"], incident["category"]) == ("driver", "gpu_reset")
            assert any("GPU reset" in line for e in incident["kernel_events"] for line in e["lines"])
            assert incident["program_failures"][0]["exception_type"] == "RuntimeError"
            detail = daemon.get(f"/incidents/{incident['id']}")
            assert detail["id"] == incident["id"]
            health = daemon.get("/healthz")
            assert {s["name"] for s in health["sources"]} >= {"journal", "files"}


def start_at_end_of_ring(state: Path) -> None:
    """Store a kmsg position at the ring's newest record, as a daemon that has been running
    would have: older test records in the shared ring stay out of this test."""
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    Store(state / "triage.db").commit(Commit(positions={"kmsg": {"boot_id": boot_id, "seq": seq_of(read_ring()[-1])}}))


@needs_kmsg
def test_traceback_alone_is_code_level_then_a_late_reset_relabels_it(tmp_path: Path) -> None:
    device = unique_device()
    start_at_end_of_ring(tmp_path / "state")
    with running_daemon(tmp_path, "--kernel-source", "kmsg") as daemon:
        log = daemon.logs / "rank0.log"
        log.write_text(TRACEBACK, encoding="utf-8")

        def code_level(incidents: list[dict[str, Any]]) -> bool:
            return any(i["program_failures"] and i["level"] == "code" for i in incidents)

        daemon.wait_for(code_level)
        code = next(i for i in daemon.get("/incidents")["incidents"] if i["program_failures"])
        assert code["category"] == "unclassified"
        # The kernel's record of the reset reaches the log a moment late: the same incident turns driver-level.
        write_kmsg(f"<3>amdgpu {device}: amdgpu: GPU reset begin!")
        daemon.wait_for(holding(device))
        relabelled = daemon.get(f"/incidents/{code['id']}")
        assert (relabelled["level"], relabelled["category"]) == ("driver", "gpu_reset")
        assert [(c["field"], c["from"], c["to"]) for c in relabelled["changes"]] == [
            ("level", "code", "driver"),
            ("category", "unclassified", "gpu_reset"),
        ]


def test_no_kernel_source_traceback_is_code_level_and_text_format(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
        (daemon.logs / "a.log").write_text(
            TRACEBACK.replace("HIP error: unspecified launch failure", "HIP out of memory. Tried to allocate 2.00 GiB"),
            encoding="utf-8",
        )
        daemon.wait_for(lambda incidents: any(i["category"] == "oom" for i in incidents))
        text = daemon.text("/incidents?format=text")
        assert "CODE   oom" in text and "hint:" in text


def stamp(seconds_ago: float) -> str:
    """A LLaMA-Factory-style log line stamped that long ago (local time, as it prints)."""
    moment = time.localtime(time.time() - seconds_ago)
    return f"[INFO|{time.strftime('%Y-%m-%d %H:%M:%S', moment)}] llamafactory.train: step done\n"


def test_sigkill_mid_stream_then_restart_loses_and_doubles_nothing(tmp_path: Path) -> None:
    first_half, second_half = stamp(0) + TRACEBACK[:150], TRACEBACK[150:]
    # Half an hour apart: two crashes, two incidents.
    oom = stamp(1800) + TRACEBACK.replace(
        "HIP error: unspecified launch failure", "HIP out of memory. Tried to allocate 1 GiB"
    )
    with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
        log = daemon.logs / "r0.log"
        log.write_text(oom, encoding="utf-8")
        daemon.wait_for(lambda incidents: len(incidents) == 1)
        with log.open("a", encoding="utf-8") as handle:
            handle.write("step 10 loss 1.0\n" + first_half)
        time.sleep(0.1)
        daemon.process.kill()  # SIGKILL: no flush, no goodbye
        daemon.process.wait()
    with log.open("a", encoding="utf-8") as handle:
        handle.write(second_half)
    with running_daemon(tmp_path, "--kernel-source", "none", name="d") as daemon:

        def both_once(incidents: list[dict[str, Any]]) -> bool:
            return sorted(i["category"] for i in incidents) == ["oom", "unclassified"]

        daemon.wait_for(both_once)
        time.sleep(1.5)  # anything doubled would show up by now
        incidents = daemon.get("/incidents")["incidents"]
        assert sorted(i["category"] for i in incidents) == ["oom", "unclassified"]
        assert all(i["count"] == 1 for i in incidents)
        failure = next(i for i in incidents if i["category"] == "unclassified")["program_failures"][0]
        assert failure["lines"][0].startswith("Traceback") and "unspecified launch failure" in "\n".join(
            failure["lines"]
        )
        events = daemon.get("/events?limit=100")["events"]
        assert len([e for e in events if e["kind"] == "program"]) == 2


def test_notify_ready_watchdog_and_clean_stop(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
        messages = daemon.read_notify(2.5)
        assert "READY=1" in messages
        assert any(m == "WATCHDOG=1" for m in messages), messages
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(timeout=20) == 0
        assert "STOPPING=1" in daemon.read_notify(0.5)


def test_sighup_with_a_bad_pattern_keeps_the_old_rules(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    good = (
        '[[rule]]\nid = "site.widget"\nsource = "program"\nregex = "widget exploded"\ncategory = "quantization"\n'
        'title = "Widget exploded"\nhint = "Call the widget team."\nmatch = ["widget exploded"]\n'
    )
    (rules / "site.toml").write_text(good, encoding="utf-8")
    with running_daemon(tmp_path, "--kernel-source", "none", "--patterns", str(rules)) as daemon:
        (rules / "site.toml").write_text(good.replace('"widget exploded"\ncategory', '"(" \ncategory'), "utf-8")
        daemon.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reload refused" not in daemon.stderr.read_text():
            assert time.monotonic() < deadline, daemon.stderr.read_text()[-2000:]
            time.sleep(0.1)
        assert "site.toml" in daemon.stderr.read_text()
        (daemon.logs / "w.log").write_text("ERROR: widget exploded at step 9\n", encoding="utf-8")
        daemon.wait_for(lambda incidents: any(i["title"] == "Widget exploded" for i in incidents))
        assert daemon.process.poll() is None


def test_refuses_to_listen_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "triage", "serve", "--listen", "0.0.0.0:8750", "--state-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "token" in done.stderr


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "triage", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path),
             "--kernel-source", "none", "--watch", str(tmp_path / "*.log")],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_only_the_very_first_start_reads_existing_logs_from_their_end(tmp_path: Path) -> None:
    logs = tmp_path / "d" / "logs"
    with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
        time.sleep(0.5)
        assert daemon.get("/incidents")["incidents"] == []
    # Stopped with no position to remember (no log yet): a log written while it was down is
    # not history from before the first start, and is read whole at the next start.
    (logs / "new.log").write_text(TRACEBACK, encoding="utf-8")
    with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
        daemon.wait_for(lambda incidents: len(incidents) == 1)
        assert "new.log" in json.dumps(daemon.get("/incidents")["incidents"][0]["program_failures"])


def test_an_incident_reaches_a_chat_webhook_once_and_alert_test_works(tmp_path: Path) -> None:
    from .support.receiver import Receiver

    chat = Receiver()
    try:
        (tmp_path / "d").mkdir()
        config = (
            "[logs]\nquiet_flush = 0.2\nrescan_interval = 1.0\n"
            f'[[alerts.sinks]]\nname = "chat"\nkind = "slack"\nurl = "{chat.url}/services/T000/B000/secret-token"\n'
        )
        (tmp_path / "d" / "triage.toml").write_text(config, encoding="utf-8")
        with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
            (daemon.logs / "r0.log").write_text(TRACEBACK, encoding="utf-8")
            daemon.wait_for(lambda incidents: len(incidents) == 1)
            deadline = time.monotonic() + 10
            while not chat.requests:
                assert time.monotonic() < deadline, "no alert reached the webhook"
                time.sleep(0.05)
            time.sleep(1.0)  # a second message would show up by now
            assert len(chat.requests) == 1
            body = chat.requests[0].body
            assert "unclassified" in body["text"] and body["blocks"]
            health = daemon.get("/healthz")
            assert health["alerts"] == {"chat": {"delivered": 1}}
            assert "secret-token" not in json.dumps(health)
        done = subprocess.run(
            [sys.executable, "-m", "triage", "alert", "test", "chat", "--config", str(tmp_path / "d" / "triage.toml")],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "delivered" in done.stdout and "secret-token" not in done.stdout
        assert len(chat.requests) == 2 and "TEST" in json.dumps(chat.requests[1].body).upper()
    finally:
        chat.stop()


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@contextmanager
def real_alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager on loopback, configured like deploy/alertmanager.yml but with short waits."""
    assert ALERTMANAGER is not None
    port = free_port()
    (tmp_path / "am").mkdir()
    config = tmp_path / "am" / "alertmanager.yml"
    config.write_text(
        "route:\n  receiver: sink\n  group_by: [alertname, job, node]\n  group_wait: 1s\n  group_interval: 1s\n"
        "inhibit_rules:\n"
        '  - source_matchers: [alertname="GPUTriageIncident", level="driver"]\n'
        '    target_matchers: [alertname="GPUTriageIncident", level="code", category="collective_failure"]\n'
        "    equal: [job]\n"
        "receivers:\n  - name: sink\n",
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'am'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "am" / "log").open("wb"),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "am" / "log").read_text()
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


def am_alerts(base: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/api/v2/alerts", timeout=5) as response:
        return [a for a in json.loads(response.read()) if a["labels"].get("alertname") == "GPUTriageIncident"]


@pytest.mark.skipif(ALERTMANAGER is None or bool(kmsg_unusable()), reason="needs prometheus-alertmanager and /dev/kmsg")
def test_two_nodes_real_alertmanager_groups_inhibits_and_resolves(tmp_path: Path) -> None:
    device = unique_device()
    with real_alertmanager(tmp_path) as am:
        for node in ("a", "b"):
            (tmp_path / node / "d").mkdir(parents=True)
            (tmp_path / node / "d" / "triage.toml").write_text(
                "[logs]\nquiet_flush = 0.2\nrescan_interval = 1.0\n"
                f'[alerts]\nnode = "node-{node}"\njob_from_path = "logs/{{job}}/rank{{rank}}.log"\n'
                "alertmanager_repeat = 1\nresolve_after = 6\n"
                f'[[alerts.sinks]]\nname = "am"\nkind = "alertmanager"\nurls = ["{am}"]\n',
                encoding="utf-8",
            )
        start_at_end_of_ring(tmp_path / "a" / "state")
        with (
            running_daemon(tmp_path / "a", "--kernel-source", "kmsg") as node_a,
            running_daemon(tmp_path / "b", "--kernel-source", "none") as node_b,
        ):
            # Node a: the GPU resets under rank 0. Node b: rank 1 of the same job times out waiting for it.
            write_kmsg(f"<3>amdgpu {device}: amdgpu: GPU reset begin!")
            (node_a.logs / "job42").mkdir()
            (node_a.logs / "job42" / "rank0.log").write_text(TRACEBACK, encoding="utf-8")
            (node_b.logs / "job42").mkdir()
            (node_b.logs / "job42" / "rank1.log").write_text(
                "[rank1]:[E1130 10:00:00.000000000 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                "ran for 600021 milliseconds before timing out.\n",
                encoding="utf-8",
            )
            deadline = time.monotonic() + 30
            while True:
                # One alert per node: an incident relabelled after it was posted (the traceback was
                # read before the reset) has its first label set resolved.
                by_node: dict[str, list[dict[str, Any]]] = {}
                for alert in am_alerts(am):
                    by_node.setdefault(alert["labels"]["node"], []).append(alert)
                settled = [len(by_node.get(node, [])) for node in ("node-a", "node-b")] == [1, 1]
                if settled and by_node["node-b"][0]["status"]["state"] == "suppressed":
                    break
                assert time.monotonic() < deadline, json.dumps(by_node, indent=1)[:3000]
                time.sleep(0.2)
            driver, code = by_node["node-a"][0], by_node["node-b"][0]
            assert (driver["labels"]["level"], driver["labels"]["category"]) == ("driver", "gpu_reset")
            assert (code["labels"]["level"], code["labels"]["category"]) == ("code", "collective_failure")
            assert driver["labels"]["job"] == code["labels"]["job"] == "job42"
            assert driver["status"]["state"] == "active" and code["status"]["inhibitedBy"]
            with urllib.request.urlopen(f"{am}/api/v2/alerts/groups", timeout=5) as response:
                groups = [g["labels"] for g in json.loads(response.read()) if g["alerts"]]
            assert {(g.get("job"), g.get("node")) for g in groups} >= {("job42", "node-a"), ("job42", "node-b")}
            time.sleep(2.5)  # re-posted every second: still firing
            assert {a["labels"]["node"] for a in am_alerts(am)} >= {"node-a", "node-b"}
            # Quiet for resolve_after: each daemon resolves its alert.
            deadline = time.monotonic() + 20
            while any(a["labels"]["node"] in ("node-a", "node-b") for a in am_alerts(am)):
                assert time.monotonic() < deadline, json.dumps(am_alerts(am), indent=1)[:2000]
                time.sleep(0.3)


def test_outbox_survives_sigkill_and_a_receiver_that_is_down(tmp_path: Path) -> None:
    from .support.receiver import Receiver

    hook = Receiver()
    hook.stop()  # down while the incidents happen
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "triage.toml").write_text(
        "[logs]\nquiet_flush = 0.2\nrescan_interval = 1.0\n[alerts]\ndigest_window = 1\n"
        f'[[alerts.sinks]]\nname = "hook"\nkind = "generic"\nurl = "{hook.url}/hook"\n',
        encoding="utf-8",
    )
    crashes = "".join(
        stamp(3600 * (3 - n)) + TRACEBACK.replace("unspecified launch failure", f"failure number {'abc'[n]}")
        for n in range(3)
    )
    try:
        with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
            (daemon.logs / "r0.log").write_text(crashes, encoding="utf-8")
            daemon.wait_for(lambda incidents: len(incidents) == 3)
            time.sleep(1.0)  # the worker has tried (connection refused) and scheduled retries
            daemon.process.kill()
            daemon.process.wait()
        hook.start()
        with running_daemon(tmp_path, "--kernel-source", "none") as daemon:
            deadline = time.monotonic() + 60
            delivered: list[str] = []
            while len(set(delivered)) < 3:
                assert time.monotonic() < deadline, f"delivered so far: {delivered}"
                time.sleep(0.2)
                delivered = [
                    incident["id"]
                    for request in hook.requests
                    for incident in (request.body.get("incidents") or [request.body.get("incident")])
                ]
            time.sleep(2.0)  # anything sent twice would arrive by now
            delivered = [
                incident["id"]
                for request in hook.requests
                for incident in (request.body.get("incidents") or [request.body.get("incident")])
            ]
            assert sorted(delivered) == sorted(set(delivered)) and len(delivered) == 3
            assert daemon.get("/healthz")["alerts"] == {"hook": {"delivered": 3}}
    finally:
        hook.stop()
