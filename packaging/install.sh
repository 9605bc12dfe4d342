#!/usr/bin/env bash
# Installs neuron-rtd system-wide for systemd: a virtual environment in $PREFIX
# (default /opt/neuron-rtd), links in /usr/bin, the unit files, and the example configs
# (existing configs are kept). Run as root from a checkout: sudo bash packaging/install.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=${PREFIX:-/opt/neuron-rtd}
destdir=${DESTDIR:-}

bash "$src/scripts/bootstrap.sh" >/dev/null  # the Debian packages systemd-python needs
python3 -m venv "$destdir$prefix"
"$destdir$prefix/bin/pip" install -q "$src"

install -d "$destdir/usr/bin" "$destdir/etc/systemd/system" "$destdir/etc/neuron-rtd/instances" \
    "$destdir/usr/share/doc/neuron-rtd"
for cmd in neuron-rtd neuron-ls; do
    ln -sf "$prefix/bin/$cmd" "$destdir/usr/bin/$cmd"
done
install -m 0644 "$src"/systemd/*.service "$destdir/etc/systemd/system/"
[ -e "$destdir/etc/neuron-rtd/neuron-rtd.json" ] ||
    install -m 0644 "$src/config/neuron-rtd.json" "$destdir/etc/neuron-rtd/"
for f in "$src"/config/instances/*.json; do
    [ -e "$destdir/etc/neuron-rtd/instances/$(basename "$f")" ] ||
        install -m 0644 "$f" "$destdir/etc/neuron-rtd/instances/"
done
install -m 0644 "$src/README.md" "$destdir/usr/share/doc/neuron-rtd/"
if [ -z "$destdir" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "installed neuron-rtd in $prefix; start it with: systemctl start neuron-rtd"
