#!/usr/bin/env bash
# Installs neuron-rtd where there is no dpkg (on Debian: make deb && dpkg -i dist/*.deb):
# the tree the Debian package holds (a virtual environment in /opt/neuron-rtd, every
# command in /usr/bin, the units, the sysusers.d and tmpfiles.d files, /etc/neuron-rtd kept
# if there) under $DESTDIR (default /), and, when installing into /, what the package's
# postinst does: the daemon's user neuron-rtd and group neuron, its folder /run/neuron-rtd
# with the links /run/neuron.sock and /run/neuron-sim, and the service.
# Needs Python 3.11+ with its venv module, and for systemd-python a C compiler, the Python
# headers and libsystemd's. Run as root: sudo bash packaging/install.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
python3 "$src/packaging/build_deb.py" --python "${PYTHON:-$(command -v python3)}" \
    --install "${DESTDIR:-/}"
