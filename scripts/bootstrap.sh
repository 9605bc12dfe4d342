#!/usr/bin/env bash
# Installs what neuron-rtd needs on a fresh Debian-like machine, saying each step as it
# starts (a fresh install takes minutes, mostly pip's):
# 1. from apt, where missing (apt-get update first; sudo unless root): pkg-config,
#    libsystemd-dev and gcc (systemd-python is compiled against libsystemd), systemd
#    (systemd-analyze, for the units' tests), python3-venv and python3-dev of /usr/bin/python3
#    (make deb builds the package's environment on the system's Python), dpkg (dpkg-deb),
#    acl (setfacl, for the trust tests), qemu-user (qemu-x86_64 -cpu Haswell: the int8 test on
#    a CPU without VNNI) and prometheus, without its recommends (it scrapes
#    neuron-monitor-prometheus in that exporter's test);
# 2. the virtual environment .venv, on $PYTHON (default python3, 3.11+);
# 3. into it with pip: pip itself upgraded, the project editable with its test tools
#    ('.[test]'), and Triton's client library (tritonclient, for the KServe tests);
# 4. the original SDK's tools (neuron-ls, neuron-cli, neuron-top, neuron-monitor) linked
#    into /opt/aws/neuron/bin, where Ray looks for neuron-ls, to .venv's: only where
#    nothing is there (the SDK's tools, the Debian package's links stay), and only when
#    this user may write there.
# apt's and pip's own progress show: pip's bars where the output is a terminal, else
# (make test in CI, a log) a line per package. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "bootstrap: $*"; }
tty=""
[ -t 1 ] && tty=1

need=() why=()
want() {  # want PACKAGE WHY: PACKAGE is to be installed from apt, for WHY
    need+=("$1")
    why+=("$1 ($2)")
}
command -v pkg-config >/dev/null 2>&1 || want pkg-config "systemd-python's build finds libsystemd"
[ -e /usr/include/systemd/sd-daemon.h ] || want libsystemd-dev "systemd-python compiles against it"
command -v gcc >/dev/null 2>&1 || want gcc "compiles systemd-python"
command -v systemd-analyze >/dev/null 2>&1 || want systemd "systemd-analyze, for the units' tests"
# the Debian package's environment is built on the system's Python (make deb, its test):
# its venv module and its headers (systemd-python is compiled against them)
if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 -c 'import ensurepip' 2>/dev/null ||
        want python3-venv "make deb's environment, on /usr/bin/python3"
    [ -e "$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] ||
        want python3-dev "make deb compiles systemd-python for /usr/bin/python3"
fi
command -v dpkg-deb >/dev/null 2>&1 || want dpkg "dpkg-deb, for make deb"
command -v setfacl >/dev/null 2>&1 || want acl "setfacl: the trust tests share an object by ACL"
command -v qemu-x86_64 >/dev/null 2>&1 || want qemu-user "runs the int8 test as a CPU without VNNI"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
quiet=()
[ -n "$tty" ] || quiet=(-q)  # apt-get's progress indicators only on a terminal
updated=""
apt_install() {  # apt_install [apt-get install options] PACKAGE...
    if [ -z "$updated" ]; then
        say "apt-get update"
        $sudo apt-get update "${quiet[@]}"
        updated=1
    fi
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${quiet[@]}" "$@"
}
if [ ${#need[@]} -gt 0 ]; then
    say "[1/4] from apt: ${why[*]}"
    apt_install "${need[@]}"
fi
# the Prometheus server that scrapes neuron-monitor-prometheus in its test; it runs without
# systemd, and needs none of its recommends (a node exporter service)
if ! command -v prometheus >/dev/null 2>&1; then
    say "[1/4] from apt: prometheus (scrapes neuron-monitor-prometheus in its test), no recommends"
    apt_install --no-install-recommends prometheus
elif [ ${#need[@]} -eq 0 ]; then
    say "[1/4] Debian packages: all there"
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info >= (3, 11), "neuron-rtd needs Python 3.11+"'
if [ -x .venv/bin/python ]; then
    say "[2/4] .venv: there already"
else
    say "[2/4] .venv: a virtual environment on $python"
    "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install "--progress-bar=$([ -n "$tty" ] && echo on || echo off)")
say "[3/4] pip: pip itself, then the project with its test tools ('.[test]'), then tritonclient"
"${pip[@]}" --upgrade pip
"${pip[@]}" -e '.[test]'
# Triton's own client library for the KServe v2 tests: its metadata pins protobuf<7, which
# it runs well with (measured); its other dependencies are in the test extra
"${pip[@]}" --no-deps 'tritonclient==2.73.0'
# The original SDK's tools also in /opt/aws/neuron/bin, where it put them: Ray counts a
# node's NeuronCores with /opt/aws/neuron/bin/neuron-ls. Linked when this user may write
# there; a tool already there (the SDK's, the Debian package's) is left alone.
# NEURON_SDK_BIN: another folder (the tests').
sdk_bin=${NEURON_SDK_BIN:-/opt/aws/neuron/bin}
say "[4/4] the SDK's tools in $sdk_bin"
if mkdir -p "$sdk_bin" 2>/dev/null && [ -w "$sdk_bin" ]; then
    for tool in neuron-ls neuron-cli neuron-top neuron-monitor; do
        if [ ! -e "$sdk_bin/$tool" ]; then  # missing, or a link to a venv since removed
            ln -sfn "$PWD/.venv/bin/$tool" "$sdk_bin/$tool"
            say "linked $sdk_bin/$tool -> $PWD/.venv/bin/$tool"
        else
            say "$sdk_bin/$tool is there already ($(readlink "$sdk_bin/$tool" || echo a file)): left as it is"
        fi
    done
else
    say "$sdk_bin not writable: Ray will not find NeuronCores (docs/scale-out.md)"
fi
touch .venv/.installed
say ".venv ready"
