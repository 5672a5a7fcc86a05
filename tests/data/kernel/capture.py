"""Capture the kernel-log fixtures of this directory from the real tools (run once, as root).

Not a test: the fixtures it writes are committed, so the tests never depend on
dmesg, journald or journalctl being present. See README.md for the recipe and
for what each output is.

Usage (Linux, root, no other journald running):
    python3 tests/data/kernel/capture.py tests/data/kernel
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOURNALD = "/lib/systemd/systemd-journald"
RSYSLOGD = "/usr/sbin/rsyslogd"
# rsyslog's imklog reads /proc/kmsg; kern.log in the traditional format with the
# kernel's [ 123.456789] stamp kept (as Ubuntu's kern.log has it), and RFC 3339.
RSYSLOG_CONF = """
global(workDirectory="{work}")
module(load="imklog" KeepKernelTimestamp="on" ParseKernelTimestamp="off" PermitNonKernelFacility="on")
if $inputname == "imklog" then {{
  action(type="omfile" file="{work}/kern.log" template="RSYSLOG_TraditionalFileFormat")
  action(type="omfile" file="{work}/kern-rfc3339.log" template="RSYSLOG_FileFormat")
}}
"""
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
RUNTIME_JOURNAL = Path("/run/log/journal")
TZ = "Europe/Berlin"
MARKER = "triage-capture: begin"

# Batches of /dev/kmsg writes; the kernel rate-limits /dev/kmsg writers to a burst of
# 10 records per 5 s, so each batch stays under 10 and batches are 5.5 s apart.
BATCHES: list[list[bytes]] = [
    [
        b"<6>" + MARKER.encode(),
        b"<4>gmc_v9_0_process_interrupt: 41 callbacks suppressed",
        b"<3>amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)",
        b"<3>amdgpu 0000:c2:00.0: amdgpu:  Process python pid 5578 thread python pid 5578",
        b"<3>amdgpu 0000:c2:00.0: amdgpu:   in page starting at address 0x00007f5e85f94000 from client 10",
        b"<3>amdgpu 0000:c2:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031",
        b"<3>amdgpu 0000:c2:00.0: amdgpu: \t Faulty UTCL2 client ID: TCP (0x8)",
        b"<3>amdgpu 0000:c2:00.0: amdgpu: \t MORE_FAULTS: 0x1",
        b"<3>amdgpu 0000:c2:00.0: amdgpu: \t PERMISSION_FAULTS: 0x3",
    ],
    [
        # Status lines before their header, as corpus case cachyos960 shows.
        b"<3>amdgpu 0000:0d:00.0: GCVM_L2_PROTECTION_FAULT_STATUS:0x00401031",
        b"<3>amdgpu 0000:0d:00.0:          Faulty UTCL2 client ID: TCP (0x8)",
        b"<3>amdgpu 0000:0d:00.0:          MORE_FAULTS: 0x1",
        b"<3>amdgpu 0000:0d:00.0: [gfxhub] page fault (src_id:0 ring:24 vmid:4 pasid:10)",
        b"<3>amdgpu 0000:0d:00.0:  Process kwin_wayland pid 1671 thread kwin_wayla:cs0 pid 1722",
        b"<3>amdgpu 0000:0d:00.0:   in page starting at address 0x00000043800e1000 from client 0x1b (UTCL2)",
    ],
    [
        b"<4>amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
        b"<3>NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        b"NVRM: fallen off the bus and is not responding to commands.",
        b"<3>NVRM: Xid (PCI:0000:0a:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        b"<6>triage-capture: non-ASCII \xc3\xa9, backslash \\, bad byte \xff, control \x01 end",
    ],
    [
        # Two GPUs interleaving their fault lines.
        b"<3>amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)",
        b"<3>amdgpu 0000:c3:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32774)",
        b"<3>amdgpu 0000:c2:00.0: amdgpu:   in page starting at address 0x00007f5e85f94000 from client 10",
        b"<3>amdgpu 0000:c3:00.0: amdgpu:   in page starting at address 0x00007f0000001000 from client 10",
        b"<3>amdgpu 0000:c2:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031",
        b"<3>amdgpu 0000:c3:00.0: amdgpu: GCVM_L2_PROTECTION_FAULT_STATUS:0x00801031",
    ],
]

#: Lines of other programs between the batches, through the real syslog and stdout transports.
OTHER_PROGRAMS: list[list[str]] = [
    ["logger", "-u", "/run/systemd/journal/dev-log", "-t", "python", "-p", "user.err", "RuntimeError: HIP error"],
    ["systemd-cat", "-t", "torchrun", "echo", "torchrun: worker 0 failed"],
    [
        "logger",
        "-u",
        "/run/systemd/journal/dev-log",
        "-t",
        "kernel-lookalike",
        "amdgpu 0000:c1:00.0: not a kernel line",
    ],
]


def read_kmsg() -> list[bytes]:
    """Every record /dev/kmsg holds now (one read() returns one record)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    records: list[bytes] = []
    try:
        while True:
            try:
                records.append(os.read(fd, 16384))
            except BlockingIOError:
                return records
            except BrokenPipeError:  # overwritten while reading: continue with the next
                continue
    finally:
        os.close(fd)


def kmsg_seq(record: bytes) -> int:
    return int(record.split(b",", 2)[1])


def write_batches() -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        for number, batch in enumerate(BATCHES):
            for record in batch:
                # The newline ends the record: without it the kernel keeps the record
                # open for a continuation and readers see it only when the next comes.
                os.write(fd, record + b"\n")
                time.sleep(0.001)
            if number < len(OTHER_PROGRAMS):
                subprocess.run(OTHER_PROGRAMS[number], check=True)
            time.sleep(5.5)
    finally:
        os.close(fd)


def settle_journald() -> None:
    """Let journald take in every pending record before it stops (one more message, a sync)."""
    for _ in range(2):
        subprocess.run(["systemd-cat", "-t", "triage-capture", "echo", "capture done"], check=True)
        time.sleep(1)
        subprocess.run(["journalctl", "--sync"], check=True)


def run(args: list[str], env_tz: bool = True) -> bytes:
    env = dict(os.environ, LC_ALL="C", TZ=TZ) if env_tz else dict(os.environ, LC_ALL="C")
    return subprocess.run(args, check=True, capture_output=True, env=env).stdout


def from_marker(output: bytes) -> bytes:
    """The lines from the last marker record on (dmesg prints the whole ring buffer)."""
    lines = output.splitlines(keepends=True)
    starts = [number for number, line in enumerate(lines) if MARKER.encode() in line]
    if not starts:
        raise SystemExit("marker not found in the output")
    return b"".join(lines[starts[-1] :])


def parse_export(data: bytes) -> list[list[tuple[str, bytes]]]:
    """Entries of a journal export stream, fields in order (binary fields decoded)."""
    entries: list[list[tuple[str, bytes]]] = []
    fields: list[tuple[str, bytes]] = []
    position = 0
    while position < len(data):
        end = data.index(b"\n", position)
        line = data[position:end]
        position = end + 1
        if not line:
            entries.append(fields)
            fields = []
        elif b"=" in line:
            key, _, value = line.partition(b"=")
            fields.append((key.decode(), value))
        else:
            (size,) = struct.unpack("<Q", data[position : position + 8])
            fields.append((line.decode(), data[position + 8 : position + 8 + size]))
            position += 8 + size + 1
    if fields:
        entries.append(fields)
    return entries


def write_export(entries: list[list[tuple[str, bytes]]]) -> bytes:
    out = bytearray()
    for fields in entries:
        for key, value in fields:
            if any(byte < 0x20 and byte != 0x09 for byte in value) or b"\n" in value:
                out += key.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
            else:
                out += key.encode() + b"=" + value + b"\n"
        out += b"\n"
    return bytes(out)


def as_kernel_facility(fields: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """A /dev/kmsg record written from user space as journald stores a record the kernel wrote.

    User-space /dev/kmsg writes get the user facility (1), so journald splits an
    `ident:` off their MESSAGE; a kernel record has facility 0, SYSLOG_IDENTIFIER=kernel
    and its whole text in MESSAGE. Records of other facilities (journald's own
    messages to /dev/kmsg) stay as they are.
    """
    values = dict(fields)
    if values.get("_TRANSPORT") != b"kernel" or values.get("SYSLOG_FACILITY") != b"1":
        return fields
    message = values.get("MESSAGE", b"")
    ident = values.get("SYSLOG_IDENTIFIER")
    if ident is not None:
        message = ident + b": " + message
    out = [(key, value) for key, value in fields if key not in ("SYSLOG_IDENTIFIER", "SYSLOG_FACILITY", "MESSAGE")]
    return [*out, ("SYSLOG_FACILITY", b"0"), ("SYSLOG_IDENTIFIER", b"kernel"), ("MESSAGE", message)]


def main(target: Path) -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: writes /dev/kmsg and starts systemd-journald")
    shutil.rmtree(RUNTIME_JOURNAL, ignore_errors=True)
    syslog_dir = Path(tempfile.mkdtemp(prefix="triage-rsyslog-"))
    (syslog_dir / "rsyslog.conf").write_text(RSYSLOG_CONF.format(work=syslog_dir))
    env = dict(os.environ, TZ=TZ)
    daemons = [
        subprocess.Popen([JOURNALD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(
            [RSYSLOGD, "-n", "-f", str(syslog_dir / "rsyslog.conf"), "-i", str(syslog_dir / "pid")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    time.sleep(2)
    try:
        start_seq = kmsg_seq(read_kmsg()[-1])
        since = f"@{int(time.time())}"
        write_batches()
        kmsg = read_kmsg()
        settle_journald()
    finally:
        for daemon in daemons:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=10)
    for name in ("kern.log", "kern-rfc3339.log"):
        (target / name).write_bytes(from_marker((syslog_dir / name).read_bytes()))
    shutil.rmtree(syslog_dir)

    # A real kernel record with SUBSYSTEM/DEVICE continuation lines, then the test window.
    with_device = [record for record in kmsg if b"\n SUBSYSTEM=" in record][-1:]
    window = [record for record in kmsg if kmsg_seq(record) > start_seq]
    (target / "kmsg.bin").write_bytes(b"".join(with_device + window))

    for name, args in {
        "dmesg.txt": ["dmesg"],
        "dmesg-x.txt": ["dmesg", "-x"],
        "dmesg-T.txt": ["dmesg", "-T"],
        "dmesg-reltime.txt": ["dmesg", "--reltime"],
        "dmesg-raw.txt": ["dmesg", "-r"],
        "dmesg-iso.txt": ["dmesg", "--time-format", "iso"],
    }.items():
        (target / name).write_bytes(from_marker(run(args)))

    journal_dir = ["journalctl", "-D", str(RUNTIME_JOURNAL), "--since", since, "--no-pager"]
    (target / "journal-live.json").write_bytes(run([*journal_dir, "-o", "json"]))
    live_export = run([*journal_dir, "-o", "export"])
    (target / "journal-live.export").write_bytes(live_export)

    rewritten = write_export([as_kernel_facility(fields) for fields in parse_export(live_export)])
    with tempfile.TemporaryDirectory() as temp:
        remote = Path(temp) / "remote.journal"
        subprocess.run([JOURNAL_REMOTE, "-o", str(remote), "-"], input=rewritten, check=True)
        reader = ["journalctl", "--file", str(remote), "--no-pager"]
        for mode in ("short", "short-iso", "short-precise", "short-monotonic", "short-full", "json", "export"):
            suffix = {"json": "json", "export": "export"}.get(mode, "txt")
            (target / f"journal-{mode}.{suffix}").write_bytes(run([*reader, "-o", mode]))
    info = {"tz": TZ, "captured": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "uname": os.uname().release}
    (target / "capture.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
