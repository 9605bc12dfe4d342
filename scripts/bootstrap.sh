#!/usr/bin/env bash
# Installs what neuron-rtd needs on a fresh Debian-like machine: the Debian packages
# systemd-python builds against (and systemd-analyze for the unit tests), then a virtual
# environment .venv with the project and its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -e /usr/include/systemd/sd-daemon.h ] || need+=(libsystemd-dev)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "bootstrap: apt-get install ${need[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info >= (3, 11), "neuron-rtd needs Python 3.11+"'
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
touch .venv/.installed
echo "bootstrap: .venv ready"
