#!/bin/sh
# psm set-up on Debian 12: install the build dependencies with apt-get,
# build, and (unless --no-run) train and test the README's main job, a small
# pointer-generator with coverage on CNN/DailyMail (about five minutes
# with the build on 2 cores; pipelines/cnndm_coverage_mini.cfg).
#   ./setup.sh            install, build, run the main job
#   ./setup.sh --no-run   install and build only (.ci/run uses this)
set -eu
cd "$(dirname "$0")"
run=yes
[ "${1:-}" = "--no-run" ] && run=no

pkgs="build-essential autoconf automake libtool pkg-config libglib2.0-dev libconfig-dev nettle-dev
      libopenblas-openmp-dev check libopenmpi-dev openmpi-bin libjson-glib-dev libsoup-3.0-dev
      libglib2.0-dev-bin chromium curl iproute2 python3"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
fi

[ -x configure ] || autoreconf -fi
# -march=native: this machine builds and runs psm (AVX2/AVX-512 for the
# vectorised activations). Set CFLAGS to build for another machine.
[ -f Makefile ] || ./configure CFLAGS="${CFLAGS:--O2 -g -march=native}"
make -j"$(nproc)"

if [ "$run" = yes ]; then
  echo "setup: training and testing pipelines/cnndm_coverage_mini.cfg (run folder runs/cnndm_coverage_mini)"
  ./psm pipelines/cnndm_coverage_mini.cfg
fi
