#!/usr/bin/env bash
# Regenerates the real PyTorch fixtures (*.log) in this directory.
#
#   tests/data/torch/generate.sh [PYTHON]     (default: the project's .venv/bin/python)
#
# Needs torch (a CPU build is enough: `make .venv/.installed-test` installs one),
# a C++ compiler for the c10::Error extension, and a few free loopback ports.
# Every *.log is the stdout+stderr of one real run; tests read only the logs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${1:-$here/../../../.venv/bin/python}
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # absolute, venv symlink kept
torchrun=$(dirname "$py")/torchrun
cd "$here"
# numpy is not installed in the test venv; its import warning is noise in every log.
export PYTHONWARNINGS="ignore:Failed to initialize NumPy"

for case in chained not_implemented_half sparse_backend cuda_not_compiled nan_anomaly \
    dtype_mismatch cpu_oom nccl_missing keyboard_interrupt custom_error exception_group; do
    "$py" errors.py "$case" > "errors-$case.log" 2>&1
done

run() {  # run LOG PORT ARGS...: one torchrun job, its output in LOG
    local log=$1 port=$2
    shift 2
    "$torchrun" --nproc-per-node=4 --master-port="$port" "$@" > "$log" 2>&1
}
run torchrun-different.log 29611 ddp.py different
run torchrun-tee-identical.log 29612 --tee 3 ddp.py identical
run torchrun-role-chained.log 29613 --role trainer --tee 3 ddp.py chained
TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[${rank}]:' run torchrun-rank-template-timeout.log 29614 --tee 3 ddp.py timeout
run torchrun-timeout.log 29615 ddp.py timeout
PYTHONFAULTHANDLER=1 run torchrun-segv.log 29616 ddp.py segv

# A C++ exception escaping a thread: terminate, what(), the c10 stack, SIGABRT.
build=${TMPDIR:-/tmp}/triage-crash-ext
mkdir -p "$build"
ext=$("$py" crash_ext.py "$build" 2>/dev/null | tail -n 1)
# Through a shell that reports the signal, as a job script's log shows it.
bash -c "'$py' crash_ext.py '$build' crash; true" > cpp-terminate.log 2>&1
sed -i '1{/\.so$/d}' cpp-terminate.log  # the module path crash_ext.py prints first
TRIAGE_CRASH_EXT=$ext run torchrun-abort.log 29617 ddp.py abort
ls -l "$here"/*.log
