#!/bin/sh
# Data-parallel training over MPI on the CNN/DailyMail small pipeline (See
# et al.'s pointer-generator, batch 16): updates per second with 1 rank x 1
# thread, 2 ranks x 1 thread (8 rows each) and 1 rank x 2 threads, side by
# side in one run, and the time each update spends in the allreduce (the
# numbers of BENCHMARKS.md section f). From the build tree:
#   sh bench/mpi.sh [UPDATES]        (default 60 updates per setting)
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-60}
cfg="$top/pipelines/cnndm_pointer_gen_small.cfg"
unset OPENBLAS_CORETYPE   # OpenBLAS picks this CPU's kernels
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-bench-mpi-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$top"
. "$top/bench/machine.sh"
machine_line
echo "# $("$top/psm" --version); $(mpirun --version | head -1)"
echo "# pipeline: $cfg, $N updates of 16 articles from step 0 (startup and the step-0 checkpoint not timed)"
rate () {   # rate NAME LAUNCHER...: updates/s from psm-run's own timing
  name=$1; shift
  "$@" "$top/psm" --mode train "$cfg" --set "run.dir=$tmp/$name" --stop-after "$N" > "$tmp/$name.out" 2>&1
  secs=$(sed -n 's/^trained [0-9]* steps in \([0-9.]*\) s.*$/\1/p' "$tmp/$name.out")
  ups=$(awk -v n="$N" -v s="$secs" 'BEGIN { printf "%.3f", n / s }')
  red=$(sed -n 's/^2 MPI ranks: \([0-9.]*\) s a step in the gradient allreduce (\([0-9]*\) floats[^)]*), \([0-9.]*\) %.*/\1 s (\3 %), \2 floats/p' "$tmp/$name.out")
  echo "$name: $N updates in $secs s = $ups updates/s${red:+; allreduce $red}"
  eval "ups_$name=$ups"
}
OMP_NUM_THREADS=1 rate rank1_thread1 env
OMP_NUM_THREADS=1 rate rank2_thread1 mpirun -np 2 --bind-to core -x OMP_NUM_THREADS
OMP_NUM_THREADS=2 rate rank1_thread2 env
awk -v a="$ups_rank1_thread1" -v b="$ups_rank2_thread1" -v c="$ups_rank1_thread2" 'BEGIN {
  printf "2 ranks x 1 thread / 1 rank x 1 thread: %.2fx\n", b / a
  printf "1 rank x 2 threads / 1 rank x 1 thread: %.2fx\n", c / a
  printf "2 ranks x 1 thread / 1 rank x 2 threads: %.2fx\n", b / c }'
