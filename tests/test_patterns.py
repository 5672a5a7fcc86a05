"""The shipped pattern catalog: it validates, its examples hold, it covers the taxonomy,
it labels the real corpus lines, and bad or slow user rules fail safely."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from triage import taxonomy
from triage.classify import best_rule
from triage.patterns import (
    MATCH_TIMEOUT,
    PatternError,
    Rule,
    check_examples,
    load_catalog,
    load_directory,
    parse_rule,
    shipped_patterns_dir,
)

REPO = Path(__file__).resolve().parents[1]
PATTERNS = REPO / "patterns"
CORPUS = REPO.parent / "shared" / "corpus" / "cases.jsonl"

RULES = load_directory(PATTERNS)
KERNEL = [rule for rule in RULES if rule.source == "kernel"]
PROGRAM = [rule for rule in RULES if rule.source == "program"]


def _toml_rule(rule_id: str, **fields: str) -> str:
    """One [[rule]] table; `fields` override or add keys (values are TOML literals)."""
    table = {
        "id": f"'{rule_id}'",
        "source": "'program'",
        "category": "'unclassified'",
        "title": "'test rule'",
        "hint": "'do something'",
        "regex": "'boom'",
        "match": "['boom happened']",
    }
    table.update(fields)
    body = "\n".join(f"{key} = {value}" for key, value in table.items())
    return f"[[rule]]\n{body}\n"


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------ the catalog


def test_shipped_dir_is_this_checkout() -> None:
    if "TRIAGE_PATTERNS_DIR" in os.environ:
        pytest.skip("TRIAGE_PATTERNS_DIR overrides the shipped directory")
    assert shipped_patterns_dir().resolve() == PATTERNS.resolve()


def test_catalog_loads_with_unique_ids() -> None:
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids))
    assert len(RULES) > 100


@pytest.mark.parametrize("rule", RULES, ids=[rule.id for rule in RULES])
def test_rule_examples_hold(rule: Rule) -> None:
    problems = list(check_examples(rule))
    assert not problems, f"{rule.file}: rule {rule.id}: " + "; ".join(problems)


def test_every_category_has_a_rule() -> None:
    covered = {rule.category for rule in RULES}
    missing = [category for category in taxonomy.CATEGORIES if category not in covered]
    assert not missing, f"no rule for {missing}"


def test_every_rule_has_prefilter_literals() -> None:
    """A rule without literals runs its regex on every line of every log: keep it out of the catalog."""
    unfiltered = [rule.id for rule in RULES if rule.literals is None]
    assert not unfiltered, f"rules whose literals cannot be derived (add `prefilter`): {unfiltered}"


def test_detail_rules_join_a_group_with_a_start() -> None:
    starts = {rule.group for rule in KERNEL if rule.group and rule.role == "start"}
    for rule in RULES:
        if rule.role == "detail":
            assert rule.source == "kernel", rule.id
            assert rule.group in starts, f"{rule.id}: no start rule in group {rule.group}"


def test_host_oom_rules_are_named_so() -> None:
    oom_kernel = [rule for rule in KERNEL if rule.category == "oom"]
    assert oom_kernel
    assert all("host_oom" in rule.id for rule in oom_kernel)


def test_hints_are_actionable() -> None:
    """A detail or follow-on line may be the only evidence of an incident: its hint must stand alone."""
    for rule in RULES:
        assert len(rule.hint) >= 80, f"{rule.id}: hint too thin"
        assert not rule.hint.startswith("See "), f"{rule.id}: hint only points at another rule"


# ------------------------------------------------------ what lines resolve to


def _best(rules: list[Rule], text: str, context: str = "") -> tuple[str, str] | None:
    found = best_rule(rules, text, context)
    return (found.rule.id, found.rule.category) if found else None


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!", "gpu_reset"),
        ("amdgpu 0000:0a:00.0: GPU reset(1) succeeded!", "gpu_reset"),
        ("amdgpu 0000:c4:00.0: MODE2 reset", "gpu_reset"),
        ("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, but soft recovered", "gpu_hang"),
        ("amdgpu 0000:04:00.0: amdgpu: Ring comp_1.1.0 reset succeeded", "gpu_hang"),
        ("amdgpu 0000:65:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE", "gpu_hang"),
        ("amdgpu 0000:c2:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32773)", "vm_page_fault"),
        ("amdgpu 0000:c2:00.0: amdgpu: \t Faulty UTCL2 client ID: TCP (0x8)", "vm_page_fault"),
        ("amdgpu 0000:dd:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!", "ras_error"),
        ("amdgpu 0000:83:00.0: amdgpu: Fatal error during GPU init", "firmware_error"),
        ("amdgpu: init_user_pages: Failed to get user pages: -1", "unclassified"),
        ("NVRM: Xid (PCI:0000:0a:00): 62, pid='<unknown>', name=<unknown>, 2023b230 20238a3a", "gpu_hang"),
        ("NVRM: Xid (PCI:0000:0a:00): 45, pid='<unknown>', name=<unknown>, Ch 00000008", "unclassified"),
        ("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.", "gpu_lost"),
        ("NVRM: fallen off the bus and is not responding to commands.", "gpu_lost"),
        ("pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0", "link_error"),
        ("pcieport 0000:00:03.0:    [12] Timeout               ", "link_error"),
        ("Out of memory: Killed process 1234 (python) total-vm:1234kB, anon-rss:1000kB", "oom"),
        (
            "python[1234]: segfault at 0 ip 00007f5c9c2a0c51 sp 00007ffd0c1c1e90 error 4 in libfoo.so[7f5c+1000]",
            "unclassified",
        ),
    ],
)
def test_kernel_line_category(line: str, category: str) -> None:
    found = _best(KERNEL, line)
    assert found is not None, f"no rule for {line!r}"
    assert found[1] == category, f"{line!r}: {found}"


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("HW Exception by GPU node-4 (Agent handle: 0x1ebc04e0) reason :GPU Hang", "gpu_hang"),
        (
            "Memory access fault by GPU node-2 (Agent handle: 0x580db0) on address 0x18000. Reason: DRAM ECC failure.",
            "ras_error",
        ),
        (
            "Memory access fault by GPU node-2 (Agent handle: 0x580db0) on address 0x18000. "
            "Reason: Page not present or supervisor privilege.",
            "illegal_memory_access",
        ),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ras_error"),
        ("Unable to determine the device handle for GPU0000:03:00.0: Unknown Error", "gpu_lost"),
        ("RuntimeError: HIP error: invalid argument", "unclassified"),
        ("RuntimeError: HIP error: invalid device function", "wrong_arch"),
        ("RuntimeError: No HIP GPUs are available", "device_unavailable"),
        ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 9.99e-05, 'epoch': 0.0}", "nan_loss"),
        ('{"loss": 2.23302879, "grad_norm": NaN, "learning_rate": 1.617e-05}', "nan_loss"),
        ("Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.", "nan_loss"),
        ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.", "flash_attn"),
        ("ModuleNotFoundError: No module named 'flash_attn'", "flash_attn"),
        ("ModuleNotFoundError: No module named 'peft'", "import_error"),
        ("Error while creating shared memory segment /dev/shm/nccl-LeXlEJ (size 9637888)", "collective_failure"),
        ("ValueError: Attempting to unscale FP16 gradients.", "dtype_config"),
        ("RuntimeError: CUDA error: device-side assert triggered", "device_assert"),
        ("ninja: build stopped: subcommand failed.", "build_error"),
    ],
)
def test_program_line_category(line: str, category: str) -> None:
    found = _best(PROGRAM, line)
    assert found is not None, f"no rule for {line!r}"
    assert found[1] == category, f"{line!r}: {found}"


@pytest.mark.parametrize(
    "line",
    [
        "Aborted (core dumped)",
        "terminate called without an active exception",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "Memory critical error by agent node-0 (Agent handle: 0x10a3dc10) on address 0x7f3c19800000. "
        "Reason: Memory in use. ",
    ],
)
def test_aftermath_lines_are_follow_ons(line: str) -> None:
    found = best_rule(PROGRAM, line)
    assert found is not None and found.rule.follow_on, line


def test_dtype_context_turns_invalid_value_into_dtype_config() -> None:
    line = "hipPeekAtLastError = hipErrorInvalidValue"
    assert _best(PROGRAM, line) == ("hip.invalid_value", "unclassified")
    context = "A=BF16\nB=BF16\nC=F32\nhipblasGemmEx = HIPBLAS_STATUS_SUCCESS"
    found = _best(PROGRAM, line, context)
    assert found is not None and found[1] == "dtype_config"


def test_fields_are_captured() -> None:
    watchdog = best_rule(
        PROGRAM,
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
        "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
    )
    assert watchdog is not None
    assert watchdog.fields["rank"] == "0" and watchdog.fields["timeout_ms"] == "600000"
    fault = best_rule(
        PROGRAM,
        "Memory access fault by GPU node-1 (Agent handle: 0x5570f8146df0) on address 0x7ff96a9ac000. "
        "Reason: Page not present or supervisor privilege",
    )
    assert fault is not None
    assert fault.fields["node"] == "1" and fault.fields["address"] == "0x7ff96a9ac000"
    xid = best_rule(KERNEL, "NVRM: Xid (PCI:0000:0a:00): 31, pid=13332, name=cuda_plot_k32_v, Ch 00000010")
    assert xid is not None
    assert xid.fields["xid"] == "31" and xid.fields["pid"] == "13332" and xid.fields["device"] == "0000:0a:00"
    vm = best_rule(KERNEL, "amdgpu 0000:c2:00.0: amdgpu:  Process python pid 5578 thread python pid 5578")
    assert vm is not None and vm.rule.role == "detail"
    assert vm.fields["pid"] == "5578" and vm.fields["process"] == "python"
    oom = best_rule(KERNEL, "Out of memory: Killed process 1234 (python) total-vm:1kB")
    assert oom is not None and oom.fields["pid"] == "1234" and oom.fields["process"] == "python"


BENIGN_KERNEL = [
    "[drm] ring gfx_32811.1.1 test pass",
    "[drm] ring gfx_32811.1.1 ib test pass",
    "[drm] ring compute_32811.2.2 was added",
    "[drm] amdgpu: 98304M of VRAM memory ready",
    "[drm] Detected VRAM RAM=98304M, BAR=98304M",
    "amdgpu 0000:c5:00.0: amdgpu: VRAM: 98304M 0x0000008000000000 - 0x00000097FFFFFFFF (98304M used)",
    "[drm] PCIE GART of 512M enabled (table at 0x00000081FFB00000).",
    "amdgpu 0000:83:00.0: amdgpu: initializing kernel modesetting (ALDEBARAN 0x1002:0x740F 0x1002:0x0C34 0x02).",
    "amdgpu 0000:83:00.0: enabling device (0000 -> 0002)",
    "amdgpu: Topology: Add CPU node",
    "amdgpu 0000:04:00.0: amdgpu: Dumping IP State",
    "amdgpu 0000:04:00.0: amdgpu: [drm] AMDGPU device coredump file has been created",
    "amdgpu 0000:03:00.0: amdgpu: RAS: optional ras ta ucode is not available",
    "amdgpu 0000:c3:00.0: amdgpu: no uncorrectable hardware errors detected in umc block",
    "amdgpu 0000:dd:00.0: amdgpu: SMU is resumed successfully!",
    "amdgpu 0000:dd:00.0: amdgpu: PSP is resuming...",
    "gmc_v10_0_process_interrupt: 41 callbacks suppressed",
    "Evicting PASID 0x8003 queues",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build",
    "NVRM: GPU at PCI:0000:0a:00: GPU-760d0170-b7c5-6817-9414-6cc7112645de",
    "nvidia-uvm: Loaded the UVM driver, major device number 510.",
    "pcieport 0000:00:01.1: AER: enabled with IRQ 28",
    "mlx5_core 0000:21:00.0 enp33s0f0: Link up",
    "snd_hda_intel 0000:c1:00.1: Refused to change power state from D0 to D3hot",
    "sched: RT throttling activated",
    "oom_kill_process.cold+0x0/0x10",
]

BENIGN_PROGRAM = [
    "/usr/lib/python3/site-packages/torch/cuda/__init__.py:641: UserWarning: Can't initialize amdsmi - Error code: 34",
    '  warnings.warn(f"Can\'t initialize amdsmi - Error code: {e.err_code}")',
    "{'loss': 1.1254, 'grad_norm': 0.8431, 'learning_rate': 4.9e-05, 'epoch': 0.12}",
    '{"loss": 1.43502216, "acc": 0.6400209, "grad_norm": 3.48362255, "learning_rate": 1.628e-05, "epoch": 0.74}',
    "{'train_runtime': 1234.5, 'train_samples_per_second': 12.3, 'train_loss': 1.23, 'epoch': 3.0}",
    " 33%|███▎      | 1000/3000 [10:00<20:00,  1.67it/s]",
    "  0%|          | 0/3000 [00:07<?, ?it/s]",
    "[INFO|trainer.py:2134] >>   Num examples = 1,000",
    "INFO:tensorflow:loss = 1.35363, step = 501, precision = 0.609375",
    "HIP kernel errors might be asynchronously reported at some other API call, "
    "so the stacktrace below might be incorrect.",
    "For debugging consider passing AMD_SERIALIZE_KERNEL=3",
    "Compile with `TORCH_USE_HIP_DSA` to enable device-side assertions.",
    "ROCk module is loaded",
    "hipblasGemmEx = HIPBLAS_STATUS_SUCCESS",
    "hipPeekAtLastError = hipSuccess",
    "W0902 15:10:48.626000 819010 torch/distributed/elastic/multiprocessing/api.py:900] "
    "Sending process 819027 closing signal SIGTERM",
    "node-12:1234:1234 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: "
    "cannot open shared object file: No such file or directory : when loading libnccl-net.so",
    "node-12:1234:1234 [0] NCCL INFO Channel 00/24 :    0   1   2   3   4   5   6   7",
    "[WARNING]  async_io requires the dev libaio .so object and headers but these were not found.",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'",
    "[INFO|modeling_utils.py:1622] >> Using flash_attention_2 as attention implementation.",
    "Successfully preprocessed all matching files.",
    "torch.cuda.is_available(): True",
]


@pytest.mark.parametrize("line", BENIGN_KERNEL)
def test_benign_kernel_lines_match_nothing(line: str) -> None:
    assert _best(KERNEL, line) is None


@pytest.mark.parametrize("line", BENIGN_PROGRAM)
def test_benign_program_lines_match_nothing(line: str) -> None:
    assert _best(PROGRAM, line) is None


# ------------------------------------------------------------- the corpus

_STAMP = re.compile(
    r"^(?:\[\s*[\d.]+\]\s*|\[\s*\+[\d.]+\]\s*|\[[A-Z][a-z]{2}\d{1,2} \d\d:\d\d\]\s*"
    r"|\[[A-Za-z]{2,3},?\s[^\]]*\d\d:\d\d:\d\d[^\]]*\]\s*)"
)
_SYSLOG = re.compile(r"^[A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d\s+\S+\s+kernel:\s*")
_RANK = re.compile(r"^(?:\[\d+\]\s*)?\[(?:rank|default)\d+\]:")


def _kernel_messages(text: str) -> list[str]:
    """Rough record split: stamps and syslog prefixes removed, indented continuations joined."""
    messages: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        line, stamped = raw, False
        for prefix in (_SYSLOG, _STAMP):
            found = prefix.match(line)
            if found:
                line, stamped = line[found.end() :], True
        if not stamped and raw[:1] in " \t" and messages:
            messages[-1] += "\n" + raw.strip()
        else:
            messages.append(line)
    return messages


def _corpus_cases() -> list[dict[str, Any]]:
    if not CORPUS.exists():
        return []
    cases = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [case for case in cases if not case.get("drop")]


CASES = _corpus_cases()


def _categories(case: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Categories the catalog gives the case's kernel records and its program lines/text."""
    kernel = {found.rule.category for msg in _kernel_messages(case["kernel_log"]) if (found := best_rule(KERNEL, msg))}
    lines = [_RANK.sub("", line) for line in case["program_log"].splitlines()]
    program: set[str] = set()
    for index, line in enumerate(lines):
        found = best_rule(PROGRAM, line, "\n".join(lines[max(0, index - 30) : index]))
        if found:
            program.add(found.rule.category)
    whole = "\n".join(lines)
    if whole.strip() and (found := best_rule(PROGRAM, whole)):
        program.add(found.rule.category)
    return kernel, program


@pytest.mark.skipif(not CASES, reason=f"no corpus at {CORPUS}")
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_corpus_case_category_is_produced(case: dict[str, Any]) -> None:
    kernel, program = _categories(case)
    accepted = {case["category"], *(case.get("also_ok") or [])}
    found = kernel | program
    assert accepted & found, f"{case['id']}: want one of {sorted(accepted)}, rules give {sorted(found)}"
    drivers = [category for category in found if taxonomy.level_of(category) == "driver"]
    if case["level"] == "driver":
        assert drivers, f"{case['id']}: driver-level case but no driver-level rule matched"
        assert taxonomy.leading_category(drivers) in accepted, f"{case['id']}: {sorted(drivers)}"
    else:
        assert not drivers, f"{case['id']}: code-level case but driver-level rules matched: {sorted(drivers)}"


# ----------------------------------------------------- bad and user rules


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"regex": "'boom(['"}, "bad regex"),
        ({"category": "'gpu_melted'"}, "unknown category"),
        ({"severity": "'high'"}, "unknown key"),
        ({"source": "'dmesg'"}, "source must be"),
        ({"match": "[]"}, "at least one example"),
    ],
)
def test_bad_rule_names_file_and_rule(tmp_path: Path, fields: dict[str, str], reason: str) -> None:
    path = _write(tmp_path, "user.toml", _toml_rule("user.ok") + _toml_rule("user.broken", **fields))
    with pytest.raises(PatternError) as caught:
        load_directory(tmp_path)
    message = str(caught.value)
    assert str(path) in message and "user.broken" in message and reason in message
    assert caught.value.rule_id == "user.broken"


def test_duplicate_id_names_both_files(tmp_path: Path) -> None:
    first = _write(tmp_path, "a.toml", _toml_rule("user.same"))
    second = _write(tmp_path, "b.toml", _toml_rule("user.same"))
    with pytest.raises(PatternError) as caught:
        load_directory(tmp_path)
    message = str(caught.value)
    assert "user.same" in message and "duplicate" in message
    assert str(second) in message and str(first) in message


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.toml", "[[rule]\nid = 'x'\n")
    with pytest.raises(PatternError) as caught:
        load_directory(tmp_path)
    assert str(path) in str(caught.value)


def test_user_directory_overrides_a_shipped_rule(tmp_path: Path) -> None:
    shipped = load_catalog()
    original = shipped.by_id("amdgpu.gpu_reset.begin")
    assert original is not None
    override = _toml_rule(
        "amdgpu.gpu_reset.begin",
        source="'kernel'",
        category="'gpu_reset'",
        title="'site-specific reset rule'",
        regex="'GPU reset begin!'",
        match="['amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!']",
    )
    path = _write(tmp_path, "site.toml", override + _toml_rule("site.extra"))
    catalog = load_catalog(extra_dirs=[tmp_path])
    replaced = catalog.by_id("amdgpu.gpu_reset.begin")
    assert replaced is not None and replaced.title == "site-specific reset rule" and replaced.file == str(path)
    assert catalog.by_id("site.extra") is not None
    assert len(catalog.rules) == len(shipped.rules) + 1
    assert str(path) in catalog.files


def test_catastrophic_user_regex_times_out() -> None:
    rule = parse_rule(
        {
            "id": "user.slow",
            "source": "program",
            "category": "unclassified",
            "title": "exponential backtracking",
            "hint": "none",
            "regex": "(a|aa)+$",
            "match": ["aa"],
        },
        "user.toml",
    )
    text = "a" * 5000 + "b"
    calls = 20
    started = time.perf_counter()
    for _ in range(calls):
        assert rule.search(text) is None
    elapsed = time.perf_counter() - started
    # Each call may use its whole MATCH_TIMEOUT; without the timeout one call would not finish at all.
    assert elapsed < calls * MATCH_TIMEOUT * 4 + 2.0, elapsed
    assert rule.search("aaaa") is not None


def _patterns_check(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "triage", "patterns", "check", str(directory)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_patterns_check_cli_fails_on_a_bad_directory(tmp_path: Path) -> None:
    path = _write(tmp_path, "user.toml", _toml_rule("user.bad", regex="'(unclosed'"))
    result = _patterns_check(tmp_path)
    assert result.returncode == 1, result
    assert str(path) in result.stderr and "user.bad" in result.stderr


def test_patterns_check_cli_reports_a_failing_example(tmp_path: Path) -> None:
    path = _write(tmp_path, "user.toml", _toml_rule("user.wrong", match="['nothing to see']"))
    result = _patterns_check(tmp_path)
    assert result.returncode == 1, result
    assert str(path) in result.stderr and "user.wrong" in result.stderr


def test_patterns_check_cli_accepts_the_shipped_catalog() -> None:
    result = _patterns_check(PATTERNS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("ok")
