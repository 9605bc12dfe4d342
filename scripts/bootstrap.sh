#!/usr/bin/env bash
# Installs what neuron-rtd needs on a fresh Debian-like machine: the Debian packages
# systemd-python builds against (and systemd-analyze for the unit tests, prometheus for the
# exporter's, the system Python's venv and headers for the Debian package's), then a
# virtual environment .venv with the project and its test tools.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ -e /usr/include/systemd/sd-daemon.h ] || need+=(libsystemd-dev)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
# the Debian package's environment is built on the system's Python (make deb, its test):
# its venv module and its headers (systemd-python is compiled against them)
if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
    [ -e "$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] ||
        need+=(python3-dev)
fi
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
# setfacl: the trust tests share an object by ACL, as docs/wire-api.md tells users to
command -v setfacl >/dev/null 2>&1 || need+=(acl)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
updated=""
apt_install() {  # apt_install [apt-get install options] PACKAGE...
    echo "bootstrap: apt-get install $*"
    [ -n "$updated" ] || $sudo apt-get update -qq
    updated=1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
if [ ${#need[@]} -gt 0 ]; then
    apt_install "${need[@]}"
fi
# the Prometheus server that scrapes neuron-monitor-prometheus in its test; it runs without
# systemd, and needs none of its recommends (a node exporter service)
command -v prometheus >/dev/null 2>&1 || apt_install --no-install-recommends prometheus

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info >= (3, 11), "neuron-rtd needs Python 3.11+"'
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# Triton's own client library for the KServe v2 tests: its metadata pins protobuf<7, which
# it runs well with (measured); its other dependencies are in the test extra
.venv/bin/python -m pip install -q --no-deps 'tritonclient==2.73.0'
# The original SDK's tools also in /opt/aws/neuron/bin, where it put them: Ray counts a
# node's NeuronCores with /opt/aws/neuron/bin/neuron-ls. Linked when this user may write
# there; a tool already there (the SDK's, the Debian package's) is left alone.
sdk_bin=/opt/aws/neuron/bin
if mkdir -p "$sdk_bin" 2>/dev/null && [ -w "$sdk_bin" ]; then
    for tool in neuron-ls neuron-cli neuron-top neuron-monitor; do
        if [ ! -e "$sdk_bin/$tool" ]; then  # missing, or a link to a venv since removed
            ln -sfn "$PWD/.venv/bin/$tool" "$sdk_bin/$tool"
        fi
    done
else
    echo "bootstrap: $sdk_bin not writable: Ray will not find NeuronCores (docs/scale-out.md)"
fi
touch .venv/.installed
echo "bootstrap: .venv ready"
