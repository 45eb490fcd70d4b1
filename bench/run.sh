#!/bin/sh
# Runs psm's benchmarks and the PyTorch reference side by side, same
# machine, same thread count (THREADS, default 2). From the build tree:
#   make bench && sh bench/run.sh
set -eu
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
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# threads: $THREADS; BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)"
echo "# jemalloc for PyTorch: ${JEMALLOC:-not found}; OpenBLAS kernels: $(PSM_PLUGIN_PATH= "$top/psm" --version | sed 's/.*kernels: \([^)]*\).*/\1/')"
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
