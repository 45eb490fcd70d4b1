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
# The read-again variants (Zeng et al. Tables 1 and 3) are --set lines on
# the small pipeline: each must pass --check too.
ablations="$top_srcdir/pipelines/gigaword_readagain_ablations.txt"
base="$top_srcdir/pipelines/gigaword_readagain_lstm_copy_small.cfg"
while read -r name sets; do
  case "$name" in '#'* | '') continue ;; esac
  n=$((n + 1))
  args=""
  for s in $sets; do args="$args --set $s"; done
  # shellcheck disable=SC2086
  if out=$("$run" --check "$base" $args 2>&1) && echo "$out" | grep -q '^check: OK$'; then
    echo "ok $n - $(basename "$base") variant $name"
  else
    echo "not ok $n - $(basename "$base") variant $name ($args)"
    echo "$out" | sed 's/^/    /'
    status=1
  fi
done < "$ablations"
# Mixed-precision training (train.precision bf16: psm_linear and
# psm_lstm_seq in bfloat16 both ways) on an LSTM LM and on See's model:
# --check's few steps must train (loss finite and falling) that way too.
for cfg in ptb_lstm_small ptb_sentinel_small cnndm_coverage_small; do
  n=$((n + 1))
  if out=$("$run" --check "$top_srcdir/pipelines/$cfg.cfg" --set 'train.precision="bf16"' 2>&1) &&
    echo "$out" | grep -q '^check: OK$'; then
    echo "ok $n - $cfg.cfg with train.precision bf16"
  else
    echo "not ok $n - $cfg.cfg with train.precision bf16"
    echo "$out" | sed 's/^/    /'
    status=1
  fi
done
[ "$n" -gt 0 ] || { echo "no pipelines found in $top_srcdir/pipelines"; exit 1; }
echo "Checks: $n pipelines, Failures: $status"
exit $status
