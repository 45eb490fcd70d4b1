#!/bin/sh
# A third party's plugin project against an installed psm, as its author
# would build it: psm (from this tree's distribution files) configured with
# a prefix of its own, built and installed there; then a copy of
# doc/examples/label_smoothing built with
#   autoreconf -fi && ./configure && make && make check && make install
# finding psm through pkg-config and m4/psm.m4 (PSM_CHECK), and the
# installed psm-run loading the installed plugin from its own plugin folder.
set -u
if [ -n "${PSM_TEST_SANITIZED:-}" ]; then
  echo "SKIP: a second build of psm under the sanitizers does not fit CI's time; the plain suite runs this"
  exit 77
fi
for tool in autoreconf libtoolize pkg-config; do
  command -v $tool > /dev/null 2>&1 || { echo "SKIP: $tool is not installed"; exit 77; }
done
# the makes below are a third party's, not sub-makes of psm's make check
# (whose TESTS and TEST_LOGS would pass to them through MAKEFLAGS)
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-sdk-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$top_srcdir/tests/tap.sh"
step () {   # step DESCRIPTION LOG COMMAND...: run, record
  desc=$1 log=$2; shift 2
  if "$@" > "$log" 2>&1; then ok "$desc"; else bad "$desc" "$log"; finish; fi
}

prefix="$tmp/prefix"
step "make distdir: psm's distributed sources" "$tmp/distdir.log" \
  make -C "$top_builddir" distdir distdir="$tmp/psm-src"
mkdir "$tmp/build"
cd "$tmp/build" || exit 1
step "psm configured with --prefix of its own" "$tmp/configure.log" \
  "$tmp/psm-src/configure" --prefix="$prefix" --without-mpi CFLAGS="-O1 -g0"
if grep -q "cannot remove" "$tmp/configure.log"; then bad "configure prints no rm errors about core/" "$tmp/configure.log"
else ok "configure prints no rm errors about core/"; fi
step "psm built and installed" "$tmp/install.log" make -j2 install
for f in bin/psm-run lib/pkgconfig/psm.pc share/aclocal/psm.m4 include/psm/psm/psm-head.h \
         lib/psm/plugins/psm-head-softmax.so share/bash-completion/completions/psm-run; do
  [ -e "$prefix/$f" ] && ok "installed $f" || bad "installed $f" /dev/null
done

PKG_CONFIG_PATH="$prefix/lib/pkgconfig"; ACLOCAL_PATH="$prefix/share/aclocal"
export PKG_CONFIG_PATH ACLOCAL_PATH
unset PSM_PLUGIN_PATH
cp -R "$top_srcdir/doc/examples/label_smoothing" "$tmp/project"
chmod -R u+w "$tmp/project"
cd "$tmp/project" || exit 1
step "example: autoreconf -fi (PSM_CHECK from the installed psm.m4)" "$tmp/p-autoreconf.log" autoreconf -fi
step "example: ./configure" "$tmp/p-configure.log" ./configure --prefix="$prefix"
grep -q "checking psm's plugin ABI... [0-9]*\.[0-9]* (psm-run: $prefix/bin/psm-run" "$tmp/p-configure.log" \
  && ok "configure reports psm's ABI and psm-run" || bad "configure reports psm's ABI and psm-run" "$tmp/p-configure.log"
step "example: make" "$tmp/p-make.log" make
step "example: make check (Check test + pipeline with the installed psm-run)" "$tmp/p-check.log" make check
grep -h -E "^(train loss|[0-9]+%: Checks)" test-label_smoothing.log pipeline.sh.log 2>/dev/null | sed 's/^/    /'
step "example: make install (into psm's plugin folder)" "$tmp/p-install.log" make install
"$prefix/bin/psm-run" --describe label_smoothing > "$tmp/describe" 2>&1 \
  && grep -q "file         $prefix/lib/psm/plugins/psm-head-label_smoothing.so" "$tmp/describe" \
  && ok "the installed psm-run finds the installed plugin" || bad "the installed psm-run finds the installed plugin" "$tmp/describe"
( cd "$tmp" && "$prefix/bin/psm-run" "$tmp/project/label_smoothing.cfg" --check ) > "$tmp/check.log" 2>&1 \
  && ok "the example pipeline passes --check with the installed psm" || bad "the example pipeline passes --check" "$tmp/check.log"
step "example: make distcheck" "$tmp/p-distcheck.log" make distcheck
finish
