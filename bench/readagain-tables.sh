#!/bin/sh
# Trains and tests every variant of pipelines/gigaword_readagain_ablations.txt
# on PIPELINE (default: the small read-again LSTM + copy pipeline), JOBS at a
# time with one thread each, into runs/readagain/NAME (its output in
# runs/readagain/NAME.log). With MODE=decode it decodes the trained runs
# again, the test split (NAME.test.log) and the CNN/DailyMail validation
# split (NAME.valid.log).
#   sh bench/readagain-tables.sh [PIPELINE] [NAME ...]
#   MODE=decode sh bench/readagain-tables.sh [PIPELINE] [NAME ...]
# RESULTS.md's read-again tables come from these runs.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
PIPELINE=${1:-pipelines/gigaword_readagain_lstm_copy_small.cfg}
[ $# -gt 0 ] && shift
JOBS=${JOBS:-2}
MODE=${MODE:-train}
OUT=${OUT:-runs/readagain}
unset OPENBLAS_CORETYPE
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$OUT"
list=$(grep -v '^#' "$top/pipelines/gigaword_readagain_ablations.txt" | grep -v '^ *$')
[ $# -gt 0 ] && list=$(echo "$list" | grep -E "^($(echo "$@" | tr ' ' '|'))( |\$)")
echo "$list" | while read -r name sets; do
  args=""
  for s in $sets; do args="$args --set $s"; done
  echo "$name$args"   # no trailing blank: xargs -L would join the next line
done | xargs -P "$JOBS" -L 1 sh -c '
  name=$1; shift
  echo "# $name: started $(date -u +%H:%M:%S)"
  run="'"$top"'/psm '"$PIPELINE"'"
  dir="--set run.dir=\"'"$OUT"'/$name\""
  if [ "'"$MODE"'" = decode ]; then
    for split in test valid; do
      eval "$run \"\$@\" $dir --mode decode --split $split" > "'"$OUT"'/$name.$split.log" 2>&1 ||
        echo "# $name: $split FAILED (see '"$OUT"'/$name.$split.log)"
    done
  else
    eval "$run \"\$@\" $dir" > "'"$OUT"'/$name.log" 2>&1 || echo "# $name: FAILED (see '"$OUT"'/$name.log)"
  fi
  echo "# $name: done $(date -u +%H:%M:%S)"' sh
