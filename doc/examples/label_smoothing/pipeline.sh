#!/bin/sh
# The installed psm-run runs the example pipeline with the plugin built here:
# --check, then a short training whose loss must fall.
set -u
tmp=$(mktemp -d "${TMPDIR:-/tmp}/label-smoothing-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$PSM_RUN" --describe label_smoothing | grep -q "epsilon" || { echo "FAIL: --describe does not show the head"; exit 1; }
"$PSM_RUN" "$srcdir/label_smoothing.cfg" --check || { echo "FAIL: --check"; exit 1; }
"$PSM_RUN" "$srcdir/label_smoothing.cfg" --quiet --set "run.dir=\"$tmp/run\"" --set train.steps=200 > "$tmp/out" 2>&1 \
  || { cat "$tmp/out"; echo "FAIL: training"; exit 1; }
loss () { grep '"split": "train"' "$tmp/run/log.jsonl" | sed 's/.*"loss": *\([0-9.e+-]*\).*/\1/'; }
first=$(loss | head -1)
last=$(loss | tail -1)
echo "train loss $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' || { echo "FAIL: the loss did not fall"; exit 1; }
echo "PASS: pipeline"
