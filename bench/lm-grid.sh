#!/bin/sh
# The language-model comparison of RESULTS.md at each model's best learning
# rate: the small PTB LSTM (Adam lr 1e-3, 2e-3, 4e-3; 5e-4 is RESULTS.md's
# earlier run) and pointer sentinel without §2.6's pointer loss (5e-4, 1e-3,
# 2e-3, 4e-3) and with it (5e-4, 1e-3), the same budget of 2,320 updates;
# the SGD collapse probes with
# and without the pointer loss; and §5.1's k1 = 1, k2 = 100 training (the
# sentinel without the pointer loss, the LSTM), 3,000 updates with a validation every
# 600 (about as long as the side-by-side runs; the report gives each
# validation's time, to compare at equal wall-clock time). Two runs at a
# time, one thread each (as RESULTS.md measured them), then the test
# split's per-word records of each sentinel run (its mean gate).
#   sh bench/lm-grid.sh [OUT]        (default runs/lm-grid; about 2.5 hours)
# With CORPUS=wikitext2: the same grid on WikiText-2 (LSTM and sentinel,
# the pipelines' own settings, pointer loss off, at 5e-4, 1e-3, 2e-3 and
# 4e-3, 1,304 updates each; about 4.5 hours), no probes, no k1 = 1 runs.
# then: python3 bench/lm-report.py OUT
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-runs/lm-grid}
mkdir -p "$out"
psm=$here/psm
run () {   # NAME PIPELINE [--set ...]
  name=$1 cfg=$2; shift 2
  env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 "$psm" "$@" --set "run.dir=\"$out/$name\"" "$here/pipelines/$cfg" \
    > "$out/$name.log" 2>&1
  echo "$name: exit $?" >> "$out/status.txt"
}
if [ "${CORPUS:-ptb}" = wikitext2 ]; then
  cd "$here" || exit 1
  for m in lstm sent; do
    cfg=wikitext2_${m}_small.cfg
    [ $m = sent ] && cfg=wikitext2_sentinel_small.cfg
    ( run ${m}_5e-4 $cfg; run ${m}_1e-3 $cfg --set train.optimizer.lr=1e-3 ) &
    ( run ${m}_2e-3 $cfg --set train.optimizer.lr=2e-3; run ${m}_4e-3 $cfg --set train.optimizer.lr=4e-3 ) &
    wait
  done
  for d in "$out"/sent_*; do
    [ -d "$d" ] && env -u OPENBLAS_CORETYPE "$psm" --mode decode --split test --set "run.dir=\"$d\"" \
      pipelines/wikitext2_sentinel_small.cfg > "$d.decode.log" 2>&1
  done
  exit 0
fi
# the SGD pipeline the first runs used (commit 1d7feba: SGD lr 5, 2,900 steps)
sgd=$out/ptb_sentinel_sgd.cfg
sed -e 's/name = "adam"; lr = 5e-4;/name = "sgd"; lr = 5;/' -e 's/steps = 2320;/steps = 2900;/' \
  "$here/pipelines/ptb_sentinel_small.cfg" > "$sgd"
probe () {   # the mean gate on the validation split after N SGD updates
  for pl in true false; do for n in 29 87; do
    d=$out/probe_pl${pl}_$n
    env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 "$psm" --mode train --set train.steps=$n --set train.eval_every=$n \
      --set model.head.pointer_loss=$pl --set "run.dir=\"$d\"" "$sgd" > "$d.log" 2>&1
    env -u OPENBLAS_CORETYPE OMP_NUM_THREADS=1 "$psm" --mode decode --split valid --set model.head.pointer_loss=$pl \
      --set "run.dir=\"$d\"" "$sgd" > "$d.decode.log" 2>&1
  done; done
}
(
  cd "$here" || exit 1   # the pipelines' data paths are relative to the project's root
  probe
  run sent_pl_5e-4 ptb_sentinel_small.cfg
  run sent_pl_1e-3 ptb_sentinel_small.cfg --set train.optimizer.lr=1e-3
  run sent_nopl_2e-3 ptb_sentinel_small.cfg --set model.head.pointer_loss=false --set train.optimizer.lr=2e-3
  run sent_nopl_1e-3 ptb_sentinel_small.cfg --set model.head.pointer_loss=false --set train.optimizer.lr=1e-3
  run lstm_4e-3 ptb_lstm_small.cfg --set train.optimizer.lr=4e-3
) &
(
  cd "$here" || exit 1
  run lstm_1e-3 ptb_lstm_small.cfg --set train.optimizer.lr=1e-3
  run lstm_2e-3 ptb_lstm_small.cfg --set train.optimizer.lr=2e-3
  run sent_nopl_5e-4 ptb_sentinel_small.cfg --set model.head.pointer_loss=false
  run k1_sent_nopl ptb_sentinel_small.cfg --set model.head.pointer_loss=false --set task.stride=1 \
    --set train.steps=3000 --set train.eval_every=600 --set train.log_every=50
  run k1_lstm ptb_lstm_small.cfg --set task.stride=1 --set train.steps=3000 --set train.eval_every=600 \
    --set train.log_every=50
  run sent_nopl_4e-3 ptb_sentinel_small.cfg --set model.head.pointer_loss=false --set train.optimizer.lr=4e-3
) &
wait
cd "$here" || exit 1
for d in "$out"/sent_* "$out"/k1_sent_*; do
  [ -d "$d" ] || continue
  env -u OPENBLAS_CORETYPE "$psm" --mode decode --split test --set "run.dir=\"$d\"" pipelines/ptb_sentinel_small.cfg \
    > "$d.decode.log" 2>&1
done
