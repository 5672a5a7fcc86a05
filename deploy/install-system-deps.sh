#!/usr/bin/env bash
# Installs the Debian packages triage needs to build and test, only when missing.
# Usage: install-system-deps.sh [run|test]
set -euo pipefail
mode=${1:-run}
want=(pkg-config libsystemd-dev gcc)
# A Python without its headers (Debian's own python3) needs the -dev and -venv packages.
if ! python3 -c 'import sysconfig,os,sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"],"Python.h")) else 1)'; then
    want+=(python3-dev python3-venv)
fi
if [ "$mode" = test ]; then
    want+=(systemd systemd-journal-remote gzip logrotate util-linux prometheus-alertmanager)
fi
missing=()
for pkg in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "triage: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "triage: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
