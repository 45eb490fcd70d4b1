#!/bin/sh
# Every pipeline in pipelines/ must pass `psm-run --check`: parse, validate,
# build, train a few steps on tiny data (loss finite and falling), decode,
# checkpoint round-trip.
set -u
run="$top_builddir/tools/psm-run"
# Pipelines name their data relative to the project's root (../shared/data);
# a build elsewhere (make check-sanitizers) says where that root is.
cd "${PSM_PROJECT_DIR:-$top_srcdir}" || exit 1
status=0
n=0
for cfg in "$top_srcdir"/pipelines/*.cfg; do
  n=$((n + 1))
  if out=$("$run" --check "$cfg" 2>&1) && echo "$out" | grep -q '^check: OK$'; then
    echo "ok $n - $(basename "$cfg")"
    echo "$out" | sed 's/^/    /'
  else
    echo "not ok $n - $(basename "$cfg")"
    echo "$out" | sed 's/^/    /'
    status=1
  fi
done
[ "$n" -gt 0 ] || { echo "no pipelines found in $top_srcdir/pipelines"; exit 1; }
echo "Checks: $n pipelines, Failures: $status"
exit $status
