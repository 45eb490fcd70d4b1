#!/bin/sh
# Trains and tests every variant of pipelines/gigaword_readagain_ablations.txt
# on PIPELINE (default: the small read-again LSTM + copy pipeline), JOBS at a
# time with one thread each, into runs/readagain/NAME (log.txt there).
#   sh bench/readagain-tables.sh [PIPELINE] [NAME ...]
# RESULTS.md's read-again tables come from these runs' test lines.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
PIPELINE=${1:-pipelines/gigaword_readagain_lstm_copy_small.cfg}
[ $# -gt 0 ] && shift
JOBS=${JOBS:-2}
OUT=${OUT:-runs/readagain}
unset OPENBLAS_CORETYPE
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$OUT"
list=$(grep -v '^#' "$top/pipelines/gigaword_readagain_ablations.txt" | grep -v '^ *$')
[ $# -gt 0 ] && list=$(echo "$list" | grep -E "^($(echo "$@" | tr ' ' '|'))( |\$)")
echo "$list" | while read -r name sets; do
  args=""
  for s in $sets; do args="$args --set $s"; done
  echo "$name $args"
done | xargs -P "$JOBS" -L 1 sh -c '
  name=$1; shift
  echo "# $name: started $(date -u +%H:%M:%S)"
  "'"$top"'/psm" "'"$PIPELINE"'" "$@" --set "run.dir=\"'"$OUT"'/$name\"" > "'"$OUT"'/$name.log" 2>&1 \
    && echo "# $name: done $(date -u +%H:%M:%S)" || echo "# $name: FAILED (see '"$OUT"'/$name.log)"' sh
