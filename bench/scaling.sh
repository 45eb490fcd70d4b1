#!/bin/sh
# See et al.'s model (bi-LSTM 256, embeddings 128, vocabulary 20,000,
# articles cut to 400 tokens and summaries to 100, coverage on: the
# paper's setting, pipelines/cnndm_coverage.cfg) trained at batch 16 and
# 64 on 1, 2, 4, 8, 16 ... cores, as every split of the cores into MPI
# ranks x OpenMP threads, and on 2 ranks the four forms of the gradient
# reduction (train.dist_shard, train.dist_overlap): target tokens a second
# (from psm-run's log, updates 2 to UPDATES: the first update's warm-up
# and the closing checkpoint left out), the seconds a step in the
# reduction, and the efficiency against linear scaling from one core. The
# table of BENCHMARKS.md section j. From the build tree:
#   sh bench/scaling.sh [UPDATES] [MAXCORES]
# UPDATES at batch 16 (default 12; a quarter of them, at least 3, at 64),
# MAXCORES the most cores used (default: all). Needs mpirun for more than
# one rank.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-12}
MAX=${2:-$(nproc)}
cfg="$top/pipelines/cnndm_coverage.cfg"
unset OPENBLAS_CORETYPE   # OpenBLAS picks this CPU's kernels
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-bench-scaling-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$top"
. "$top/bench/machine.sh"
machine_line
echo "# $("$top/psm" --version); $(mpirun --version 2>/dev/null | head -1 || echo 'no mpirun')"
echo "# pipeline: $cfg with vocabulary 20,000 and coverage; $N updates at batch 16, $(( N / 4 > 3 ? N / 4 : 3 )) at 64, from step 0; timed from the end of the first update to the end of the last"
echo "| batch | cores | ranks x threads | reduction | target tokens/s | s a step in the reduction | efficiency |"
echo "|---|---|---|---|---|---|---|"
run () {   # run BATCH RANKS THREADS FORM: one line of the table
  b=$1 r=$2 th=$3 form=$4
  n=$N
  [ "$b" -gt 16 ] && n=$(( N / 4 > 3 ? N / 4 : 3 ))
  case $form in
    default) sets="" ;;
    plain) sets="--set train.dist_shard=false --set train.dist_overlap=false" ;;
    shard) sets="--set train.dist_shard=true --set train.dist_overlap=false" ;;
    overlap) sets="--set train.dist_shard=false --set train.dist_overlap=true" ;;
  esac
  dir="$tmp/b${b}_${r}x${th}_$form"
  launch=""
  [ "$r" -gt 1 ] && launch="mpirun -np $r --bind-to none -x OMP_NUM_THREADS -x PSM_PLUGIN_PATH"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$th $launch "$top/psm" --mode train "$cfg" --set task.vocab=20000 \
    --set model.decoder.coverage=true --set model.head.cov_loss_wt=1.0 --set train.batch="$b" \
    --set train.eval_every=1000000 --set train.log_every=1 $sets --set "run.dir=\"$dir\"" --stop-after "$n" \
    > "$dir.out" 2>&1 || { echo "| $b | $((r * th)) | $r x $th | $form | FAILED: $(tail -1 "$dir.out") | | |"; return; }
  # target tokens a second over updates 2 to n from the log's records (one
  # an update): the first update's warm-up and the last checkpoint left out
  tps=$(sed -n 's/.*"split": "train", "time": \([0-9.]*\),.*"tgt_tokens_per_s": \([0-9.]*\),.*/\1 \2/p' "$dir/log.jsonl" |
        awk 'NR == 1 { t0 = $1; p = $1; next } { tok += $2 * ($1 - p); p = $1 } END { if (p > t0) printf "%.0f", tok / (p - t0) }')
  red=$(sed -n 's/^[0-9]* MPI ranks: \([0-9.]*\) s a step in the gradient allreduce.*/\1/p' "$dir.out")
  eval "base=\${base_$b:-}"
  if [ -z "$base" ]; then base=$tps; eval "base_$b=$tps"; fi
  eff=$(awk -v t="$tps" -v b="$base" -v c=$((r * th)) 'BEGIN { printf "%.0f %%", 100 * t / (b * c) }')
  echo "| $b | $((r * th)) | $r x $th | $form | $tps | ${red:-—} | $eff |"
}
for b in 16 64; do
  c=1
  while [ "$c" -le "$MAX" ]; do
    r=1
    while [ "$r" -le "$c" ]; do
      th=$((c / r))
      if [ $((r * th)) -eq "$c" ] && [ "$r" -le "$b" ]; then
        run "$b" "$r" "$th" default
        if [ "$r" -eq 2 ] && [ "$th" -eq 1 ]; then
          for form in plain shard overlap; do run "$b" 2 1 "$form"; done
        fi
      fi
      r=$((r * 2))
    done
    c=$((c * 2))
  done
done
