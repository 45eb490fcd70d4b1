#!/bin/sh
# Runs psm's benchmarks and the PyTorch reference side by side, same
# machine, same thread count (THREADS, default 2). From the build tree:
#   make bench && sh bench/run.sh [all | gru | see | lm]
# (gru: sections a and b, see: section c, lm: section d)
set -eu
WHAT=${1:-all}
top=$(cd "$(dirname "$0")/.." && pwd)
THREADS=${THREADS:-2}
SECONDS_PER=${SECONDS_PER:-3}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
# Both sides use the same OpenBLAS (Debian's PyTorch calls the system BLAS:
# BLAS_INFO=generic). Let OpenBLAS pick its kernels for this CPU, unless
# BENCH_OPENBLAS_CORETYPE names some (an inherited OPENBLAS_CORETYPE, such as
# this workplace's Haswell, would hobble both sides).
unset OPENBLAS_CORETYPE
[ -n "${BENCH_OPENBLAS_CORETYPE:-}" ] && export OPENBLAS_CORETYPE="$BENCH_OPENBLAS_CORETYPE"
# PyTorch's best runtime on Debian: jemalloc, OpenBLAS's OpenMP build.
JEMALLOC=$(ls /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 2>/dev/null || true)
# ... and jemalloc keeping the pages it has used: with its default decay it
# hands freed memory back to the kernel, and on this virtual machine the
# page faults of re-touching it made the See model's step 14x slower
# (BENCHMARKS.md, section c).
export MALLOC_CONF=${MALLOC_CONF:-dirty_decay_ms:-1,muzzy_decay_ms:-1}
. "$top/bench/machine.sh"
echo "$(machine_line); $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "# threads: $THREADS; BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
echo "# jemalloc for PyTorch: ${JEMALLOC:-not found} (MALLOC_CONF=$MALLOC_CONF); OpenBLAS kernels: $(PSM_PLUGIN_PATH= "$top/psm" --version | sed 's/.*kernels: \([^;)]*\).*/\1/')"
if [ "$WHAT" = all ] || [ "$WHAT" = gru ]; then
echo
echo "## (a) matmul forward+backward: psm op vs bare cblas_sgemm"
"$top/bench/bench-matmul" 1.0
echo
echo "## (b) GRU training step (T=35, input = hidden), psm vs PyTorch"
printf '%-6s %-6s %12s %12s %10s\n' B H "psm ms" "torch ms" "torch/psm"
for shape in "16 256" "32 256" "64 256" "250 1000"; do
  set -- $shape
  p=$("$top/bench/bench-gru" "$1" "$2" 35 "$SECONDS_PER" | sed 's/.*: \([0-9.]*\) ms.*/\1/')
  t=$(LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/gru_torch.py" "$1" "$2" 35 "$SECONDS_PER")
  tm=$(echo "$t" | sed 's/.*: \([0-9.]*\) ms.*/\1/')
  printf '%-6s %-6s %12s %12s %10.2f\n' "$1" "$2" "$p" "$tm" "$(echo "$tm / $p" | bc -l)"
done
echo "# $t" | sed 's/ B=.*(/ (/'
fi
cd "$top"
export PSM_PLUGIN_PATH="$top/plugins/.libs"
if [ "$WHAT" = all ] || [ "$WHAT" = lm ]; then
echo
echo "## (d) LSTM language model, Merity et al.'s medium setting (2 x 650, PTB, batch 32 x BPTT 100), psm vs PyTorch"
data="${PSM_DATA:-$top/../shared/data}/ptb"
lsec=${LM_SECONDS:-$((SECONDS_PER * 4))}
t=$(LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/lm_torch.py" train "$lsec" "$data/ptb.train.txt")
p=$("$top/bench/bench-lm" train "$lsec" model.encoder.zoneout=0)
pz=$("$top/bench/bench-lm" train "$lsec")
# the sentinel's cost: both heads trained in turns, an update each, so that
# the host's drift between two separate runs does not count as cost
ps=$("$top/bench/bench-lm" pair $((lsec * 2)) model.encoder.zoneout=0)
# PyTorch in mixed precision too (torch.autocast bfloat16: its linear
# products in bf16 through oneDNN, on AMX where there is one): its best
# runtime on such a CPU, which psm is also set against
ta=$(TORCH_AUTOCAST=bf16 LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/lm_torch.py" train "$lsec" "$data/ptb.train.txt")
# and psm in mixed precision (train.precision bf16: its linear products and
# LSTM recurrences in bf16 both ways, on AMX where there is one)
pb=$("$top/bench/bench-lm" train "$lsec" model.encoder.zoneout=0 train.precision=bf16)
echo "$t"; echo "(autocast bf16) $ta"; echo "$p"; echo "(with zoneout 0.5) $pz"; echo "(pointer sentinel, L = 100) $ps"
echo "$pb" | sed 's/^/(train.precision bf16) /'
tw=$(echo "$t" | sed -n 's/.*ms\/step, \([0-9.]*\) words.*/\1/p')
taw=$(echo "$ta" | sed -n 's/.*ms\/step, \([0-9.]*\) words.*/\1/p')
pw=$(echo "$p" | sed -n 's/.*ms\/step, \([0-9.]*\) words.*/\1/p')
sc=$(echo "$ps" | sed -n 's/.*sentinel head costs \(-*[0-9.]*\) % over the softmax.*/\1/p')
printf 'training: psm / PyTorch words/s = %.2f; sentinel head costs %.1f %% over the softmax (paired)\n' \
  "$(echo "$pw / $tw" | bc -l)" "$sc"
printf 'training: psm / PyTorch with autocast bf16 words/s = %.2f\n' "$(echo "$pw / $taw" | bc -l)"
pbw=$(echo "$pb" | sed -n 's/.*ms\/step, \([0-9.]*\) words.*/\1/p')
printf 'training, train.precision bf16: psm / PyTorch words/s = %.2f; psm / PyTorch with autocast bf16 = %.2f\n' \
  "$(echo "$pbw / $tw" | bc -l)" "$(echo "$pbw / $taw" | bc -l)"
"$top/bench/bench-lm" eval eval.batch=32
"$top/bench/bench-lm" eval eval.batch=64
BENCH_LM_CFG=pipelines/ptb_sentinel.cfg "$top/bench/bench-lm" eval eval.batch=64
LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/lm_torch.py" eval "$data/ptb.test.txt" "$data/ptb.train.txt"
fi
[ "$WHAT" = all ] || [ "$WHAT" = see ] || exit 0
echo
echo "## (c) See et al.'s pointer-generator with coverage (vocab 20k, emb 128, hidden 256, B 16, 400/100), psm vs PyTorch"
arts=$(mktemp)
rundir=$(mktemp -d)
trap 'rm -rf "$arts" "$rundir"' EXIT
# the validation articles of ../shared/data/cnndm, one a line
/usr/bin/python3 -c 'import json, sys
for l in open(sys.argv[1], encoding="utf-8"):
    print(json.loads(l)["article"].replace("\n", " "))' "${PSM_DATA:-$top/../shared/data}/cnndm/valid.jsonl" > "$arts"
N_DECODE=${N_DECODE:-48}
# training: the sources are the first 16 of those articles with 400 tokens
p=$(BENCH_SEE_ARTICLES="$arts" BENCH_PROFILE=1 "$top/bench/bench-see" train "$SECONDS_PER")
t=$(LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/see_torch.py" train "$SECONDS_PER")
# and in mixed precision (autocast bf16, as in section d)
ta=$(TORCH_AUTOCAST=bf16 LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/see_torch.py" train "$SECONDS_PER")
pb=$(BENCH_SEE_SET='train.precision="bf16"' BENCH_SEE_ARTICLES="$arts" BENCH_PROFILE=1 "$top/bench/bench-see" train "$SECONDS_PER")
echo "$p"; echo "$t"; echo "(autocast bf16) $ta"
echo "$pb" | sed 's/^/(train.precision bf16) /'
ptok=$(echo "$p" | sed -n 's/.*ms\/step, \([0-9.]*\) target.*/\1/p')
ttok=$(echo "$t" | sed -n 's/.*ms\/step, \([0-9.]*\) target.*/\1/p')
tatok=$(echo "$ta" | sed -n 's/.*ms\/step, \([0-9.]*\) target.*/\1/p')
printf 'training: psm / PyTorch target tokens/s = %.2f\n' "$(echo "$ptok / $ttok" | bc -l)"
printf 'training: psm / PyTorch with autocast bf16 target tokens/s = %.2f\n' "$(echo "$ptok / $tatok" | bc -l)"
pbtok=$(echo "$pb" | sed -n 's/.*ms\/step, \([0-9.]*\) target.*/\1/p')
printf 'training, train.precision bf16: psm / PyTorch target tokens/s = %.2f; psm / PyTorch with autocast bf16 = %.2f\n' \
  "$(echo "$pbtok / $ttok" | bc -l)" "$(echo "$pbtok / $tatok" | bc -l)"
# decoding as psm-run --mode decode on a run folder: the vocabulary saved there
"$top/bench/bench-see" vocab "$rundir"
p=$("$top/bench/bench-see" decode "$arts" "$N_DECODE" "$rundir")
t=$(LD_PRELOAD="$JEMALLOC" /usr/bin/python3 "$top/bench/see_torch.py" decode "$arts" "$N_DECODE")
echo "$p"; echo "$t"
pa=$(echo "$p" | sed -n 's/.*: \([0-9.]*\) articles.*/\1/p')
ta=$(echo "$t" | sed -n 's/.*: \([0-9.]*\) articles.*/\1/p')
printf 'decoding: psm / PyTorch articles/s = %.2f\n' "$(echo "$pa / $ta" | bc -l)"
