#!/bin/sh
# Zeng et al.'s Table 4 here: decoding time per sentence against the
# decoder vocabulary, with and without copy, beam 10, every summary 15 words
# (min_len = max_len = 15, so every setting decodes the same number of
# steps), the 1,000 Gigaword test sentences in batches of 6 (eval.batch = 64
# hypotheses: 6 sentences x beam 10), THREADS
# threads (default 2). Decoding time does not depend on what a model has
# learnt, so each setting is the paper-size model (read-again LSTM 512,
# embeddings 512: gigaword_readagain_lstm_copy.cfg) after one update; the
# trained small models' runs print the same split (RESULTS.md).
#   sh bench/readagain-decode.sh [VOCAB ...]     (default 2000 5000 15000 125000)
# 125000 means every target word of the training split (20,000-odd here).
# SETS="KEY=VALUE ..." adds --set lines to every setting (e.g.
# SETS="model.head.hidden=512 model.head.activation=linear", or
# SETS=decode.sort=false to decode in the split's order). OUT=DIR of an
# earlier run decodes its models again (no training).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
THREADS=${THREADS:-2}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
unset OPENBLAS_CORETYPE
OUT=${OUT:-$(mktemp -d /tmp/psm-readagain-decode.XXXXXX)}
mkdir -p "$OUT"
. "$top/bench/machine.sh"
machine_line
echo "# threads: $THREADS; runs in $OUT; extra settings: ${SETS:-none}"
for v in ${*:-2000 5000 15000 125000}; do
  for head in softmax copy; do
    dir="$OUT/v${v}_$head"
    set -- --set "task.tgt_vocab=$v" --set "model.head.plugin=$head" --set "run.dir=\"$dir\"" \
      --set decode.min_len=15 --set decode.max_len=15 --set decode.beam=10
    for kv in ${SETS:-}; do set -- "$@" --set "$kv"; done
    [ -f "$dir/best.ckpt" ] ||   # OUT of an earlier run: its models again
      "$top/psm" "$top/pipelines/gigaword_readagain_lstm_copy.cfg" "$@" --mode train --set train.steps=1 \
        --set train.valid_examples=64 > "$dir.train.log" 2>&1
    line=$("$top/psm" "$top/pipelines/gigaword_readagain_lstm_copy.cfg" "$@" --mode decode 2>&1 | grep '^decoding')
    words=$(grep -m1 vocabularies "$dir.train.log" | sed -n 's/.*vocabularies [0-9]* source, \([0-9]*\) target.*/\1/p')
    echo "vocab $v ($words words) head $head: $line"
  done
done
