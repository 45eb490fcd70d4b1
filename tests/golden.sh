#!/bin/sh
# Golden outputs (issue 60): one small run of each model family of the
# shipped *_small pipelines — See et al.'s coverage model, the pointer
# sentinel LM, Gulcehre's pointer softmax on Multi30k and on headlines,
# Zeng's read-again + copy, the rarest-word task — trained at one thread
# (losses and validations of every update, as log.jsonl prints them: nine
# significant digits, every bit of a float), then its test split decoded
# (the text and the --json records). A refactoring that is meant to keep
# the numbers must keep these files byte for byte.
#
# Byte equality holds only for one build on one kind of CPU: the vector
# width, the compiler's tuning (which multiply-adds it fuses) and the BLAS
# kernels change the last bits. So the golden files are kept per build key
# (tests/golden/KEY/, KEY = a hash of the compiler, its flags, the CPU's
# family/model and vector extensions, the BLAS kernels; tests/golden/KEY/KEY
# says which). Where no golden files exist for this build, the losses are
# compared with the other builds' at a relative tolerance of 1e-3 instead
# (the text is not: a near-tie in the beam may fall either way) and the
# byte comparison is reported as skipped.
#
# Re-record (when a change is meant to alter the numbers, and say so in its
# commit): GOLDEN_RECORD=1 make check TESTS=tests/golden.sh, or from a build
# folder: GOLDEN_RECORD=1 top_builddir=. top_srcdir=SRC sh SRC/tests/golden.sh
# GOLDEN_SIZE=full runs each pipeline at its own size (50 updates, 20 test
# examples; minutes, not for make check) into tests/golden/KEY-full/.
set -u
run="$top_builddir/tools/psm-run"
src=$(cd "$top_srcdir" && pwd)
cd "${PSM_PROJECT_DIR:-$top_srcdir}" || exit 1   # the pipelines' data paths (../shared/data)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-golden-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/tap.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
unset OPENBLAS_CORETYPE

if [ ! -f ../shared/data/cnndm/train.jsonl ]; then
  echo "1..0 # SKIP ../shared/data is not beside the project"; exit 77
fi
if [ -n "${PSM_TEST_SANITIZED:-}" ]; then
  echo "1..0 # SKIP golden outputs are of the optimised build (the sanitizers' -O1 rounds differently)"; exit 77
fi

# --- the build key ---
cflags=$(sed -n 's/^CFLAGS = //p; s/^CPPFLAGS = //p' "$top_builddir/Makefile" | tr '\n' ' ')
cc=$(sed -n 's/^CC = //p' "$top_builddir/Makefile")
ccver=$($cc --version 2>/dev/null | head -1)
march=$($cc $cflags -Q --help=target 2>/dev/null | sed -n 's/^ *-m\(arch\|tune\)=[[:space:]]*\([^[:space:]]*\).*/\1=\2/p' | tr '\n' ' ')
cpu=$(awk -F': ' '/^cpu family/ { f = $2 } /^model\t/ { m = $2 } END { print "family " f " model " m }' /proc/cpuinfo)
isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512f|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ')
blas=$("$run" --version | sed -n 's/.*OpenBLAS kernels: \([^;)]*\).*/\1/p')
keytext="cc: $ccver; flags: $cflags; target: $march; cpu: $cpu; isa: $isa; blas: $blas"
key=$(printf '%s\n' "$keytext" | sha256sum | cut -c1-12)
size=${GOLDEN_SIZE:-reduced}
[ "$size" = full ] && key="$key-full"
gold="$src/tests/golden/$key"
echo "# build key $key: $keytext"

# --- the families: NAME PIPELINE --set lines (reduced size, then full) ---
common="train.log_every=1 train.seed=1"
families () {
  if [ "$size" = full ]; then
    cat <<EOF
cnndm_coverage  cnndm_coverage_small  train.steps=40 continue.steps=10 train.eval_every=20 train.valid_examples=64 eval.examples=20
ptb_sentinel    ptb_sentinel_small    train.steps=50 train.eval_every=25 train.valid_examples=3200 eval.examples=20
europarl_ps     europarl_ps_small     train.steps=50 train.eval_every=25 train.valid_examples=256 eval.examples=20
gigaword_ps     gigaword_ps_small     train.steps=50 train.eval_every=25 train.valid_examples=256 eval.examples=20
readagain_copy  gigaword_readagain_lstm_copy_small  train.steps=50 train.eval_every=25 train.valid_examples=256 eval.examples=20
rarest_word     rarest_word_ps_small  train.steps=50 train.eval_every=25 eval.examples=20
EOF
  else
    cat <<EOF
cnndm_coverage  cnndm_coverage_small  task.max_train=96 task.vocab=1500 task.max_src=80 task.max_tgt=20 train.batch=8 train.steps=8 continue.steps=4 train.eval_every=4 train.valid_examples=16 eval.examples=3 decode.min_len=4 decode.max_len=20
ptb_sentinel    ptb_sentinel_small    task.max_train=12000 task.bptt=30 model.head.window=30 train.batch=8 train.steps=10 train.eval_every=5 train.valid_examples=16 eval.examples=4
europarl_ps     europarl_ps_small     task.max_train=400 task.src_vocab=600 task.tgt_vocab=600 train.batch=16 train.steps=10 train.eval_every=5 train.valid_examples=32 eval.examples=4
gigaword_ps     gigaword_ps_small     task.max_train=400 train.batch=16 train.steps=10 train.eval_every=5 train.valid_examples=32 eval.examples=4 task.lvt=300
readagain_copy  gigaword_readagain_lstm_copy_small  task.max_train=300 task.tgt_vocab=1000 train.batch=16 train.steps=10 train.eval_every=5 train.valid_examples=32 eval.examples=4 eval.batch=20
rarest_word     rarest_word_ps_small  train.batch=32 train.steps=10 train.eval_every=5 task.valid_size=40 task.test_size=8 eval.examples=8
EOF
  fi
}

# one family's record: the log's train and valid records without their
# clock fields, then the decoded text and JSON of the test split
record () {
  dir=$1
  echo "## log.jsonl (without time and tokens_per_s)"
  sed 's/"time": [^,]*, //; s/, "tokens_per_s": [^,}]*//; s/, "tgt_tokens_per_s": [^,}]*//; s/, "updates_per_s": [^,}]*//' "$dir/log.jsonl"
  echo "## decode.test.txt"
  cat "$dir/decode.test.txt"
  if [ -f "$dir/decode.test.jsonl" ]; then   # the sequence-to-sequence tasks write one
    echo "## decode.test.jsonl"
    cat "$dir/decode.test.jsonl"
  fi
}
# the losses of a record, one "step split loss" a line
losses () { sed -n 's/.*"step": \([0-9]*\), "split": "\([a-z]*\)".*"loss": \([^,}]*\).*/\1 \2 \3/p' "$1"; }
# two loss lists agree within a relative 1e-3 (same steps, same splits)
close () {
  paste -d' ' "$1" "$2" | awk 'NF != 6 || $1 != $4 || $2 != $5 { bad = 1; exit }
    { d = $3 - $6; if (d < 0) d = -d; m = $6 < 0 ? -$6 : $6; if (d > 1e-3 * m + 1e-6) { bad = 1; exit } }
    END { exit bad }' && [ "$(wc -l < "$1")" = "$(wc -l < "$2")" ] && [ -s "$1" ]
}

[ -n "${GOLDEN_RECORD:-}" ] && mkdir -p "$gold" && printf '%s\n' "$keytext" > "$gold/KEY"
families | while read -r name pipe sets; do
  args="--set run.dir=\"$tmp/$name\""
  for s in $common $sets; do args="$args --set $s"; done
  if ! eval "\"$run\" --mode train pipelines/$pipe.cfg $args" > "$tmp/$name.train.out" 2>&1; then
    echo "FAIL $name: training failed"; tail -20 "$tmp/$name.train.out"; continue
  fi
  if ! eval "\"$run\" --mode decode --split test --json pipelines/$pipe.cfg $args" > "$tmp/$name.decode.out" 2>&1; then
    echo "FAIL $name: decoding failed"; tail -20 "$tmp/$name.decode.out"; continue
  fi
  record "$tmp/$name" > "$tmp/$name.golden"
  if [ -n "${GOLDEN_RECORD:-}" ]; then
    cp "$tmp/$name.golden" "$gold/$name.golden"
    echo "RECORDED $name"
  elif [ -f "$gold/$name.golden" ]; then
    if cmp -s "$tmp/$name.golden" "$gold/$name.golden"; then echo "SAME $name"
    else echo "DIFF $name"; diff "$gold/$name.golden" "$tmp/$name.golden" | head -20 | cut -c1-200; fi
  else
    losses "$tmp/$name.golden" > "$tmp/$name.losses"
    found=0
    for g in "$src"/tests/golden/*/"$name.golden"; do
      case $g in *-full/*) [ "$size" = full ] || continue ;; *) [ "$size" = full ] && continue ;; esac
      [ -f "$g" ] || continue
      found=1
      losses "$g" > "$tmp/$name.other"
      if close "$tmp/$name.losses" "$tmp/$name.other"; then echo "CLOSE $name $g"; else echo "FAR $name $g"; fi
    done
    [ $found = 1 ] || echo "NONE $name"
  fi
done > "$tmp/results"
cat "$tmp/results" | grep -v '^SAME\|^CLOSE\|^RECORDED' | sed 's/^/# /'

for name in $(families | awk '{ print $1 }'); do
  if grep -q "^RECORDED $name" "$tmp/results"; then ok "$name: golden outputs recorded in tests/golden/$key"
  elif grep -q "^SAME $name" "$tmp/results"; then ok "$name: training losses and decoded test outputs equal the golden ones byte for byte"
  elif grep -q "^CLOSE $name" "$tmp/results" && ! grep -q "^FAR $name" "$tmp/results"; then
    ok "$name: losses within 1e-3 of every other build's golden ones # byte comparison SKIP: no golden files for build $key"
  elif grep -q "^NONE $name" "$tmp/results"; then ok "$name: runs # SKIP no golden files to compare with"
  elif grep -q "^FAIL $name" "$tmp/results"; then bad "$name: the run failed (see above)" /dev/null
  else bad "$name: outputs differ from the golden ones (see above)" /dev/null; fi
done
finish
