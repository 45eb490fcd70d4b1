#!/bin/sh
# Fuzzes psm's readers with libFuzzer (clang, Debian's clang + libclang-rt-dev)
# under AddressSanitizer + UBSan, and keeps what it finds:
#   sh fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default 60 s, every target)
#   FUZZ_RUNS=10000000 sh fuzz/run.sh 20000 ...   (also stop a target after that many executions)
#   FUZZ_MAX_LEN=4096 sh fuzz/run.sh ...   (the largest input; default 1 MiB, the server's
#                                          --max-body: a 4 KiB cap hid issue 58's deep nesting)
# Builds an instrumented psm (libpsm and the plugins) in _fuzz/ (again when
# the sources change), runs
# each target (fuzz/psm-fuzz.c) for the given time on one core per target,
# two at a time, starting from fuzz/corpus/TARGET/, then merges the inputs
# that reached new code into fuzz/corpus/TARGET/, which make check replays
# (tests/fuzz-replay). Prints executions, speed, corpus and findings per
# target; a crash, a hang (10 s an input) or a sanitizer report leaves the
# input in _fuzz/TARGET/ and makes the script exit 1.
# Leaks: libFuzzer checks for them after every input that allocated more
# than it freed. libconfig 1.5 leaks its scanner's strings on every parse
# error (fuzz/lsan.supp), so in the pipeline target nearly every input was
# followed by a scan of the whole heap (13x slower). That target fuzzes
# without the per-input check; its whole corpus, old and new inputs, is
# then replayed with leak checks on, and a leak there fails the run as a
# report during fuzzing would.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
max_len=${FUZZ_MAX_LEN:-1048576}
[ $# -gt 0 ] && shift
targets=${*:-pipeline checkpoint cnndm_jsonl cnndm_lines headline lm nmt view_record serve_request stream_state saved_vocab convert}
build=${PSM_FUZZ_BUILD:-$top/_fuzz}
command -v clang > /dev/null || { echo "fuzz/run.sh: needs clang (apt-get install clang libclang-rt-dev)"; exit 2; }
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
mkdir -p "$build"
# the sources as make dist has them (the source tree is configured for the
# plain build), rebuilt when they changed
make -C "$top" distdir distdir="$build/src.new" > /dev/null 2>&1 || { echo "fuzz/run.sh: make distdir failed"; exit 2; }
if [ -d "$build/src" ] && diff -r -q "$build/src" "$build/src.new" > /dev/null; then
  rm -rf "$build/src.new"
else
  rm -rf "$build/src" "$build/obj" && mv "$build/src.new" "$build/src"
fi
if [ ! -f "$build/obj/Makefile" ]; then
  echo "fuzz/run.sh: configuring an instrumented build in $build/obj"
  mkdir -p "$build/obj"
  (cd "$build/obj" && ../src/configure CC=clang CFLAGS="-O1 -g $san -fsanitize=fuzzer-no-link" LDFLAGS="$san" \
     --without-mpi > configure.log 2>&1) || { echo "configure failed: $build/obj/configure.log"; exit 2; }
fi
make -C "$build/obj" -j2 > "$build/make.log" 2>&1 || { echo "build failed: $build/make.log"; exit 2; }
obj=$build/obj
# shellcheck disable=SC2046
clang -O1 -g $san -fsanitize=fuzzer -I"$obj" -I"$top/core" -I"$top/fuzz" -I"$top/tools" -I"$obj/tools" \
  $(pkg-config --cflags glib-2.0 libconfig json-glib-1.0) "$top/fuzz/psm-fuzz.c" "$top/fuzz/fuzz-main.c" \
  "$top/tools/psm-view.c" "$top/tools/psm-request.c" "$top/tools/psm-convert.c" "$obj/tools/psm-resources.c" \
  -o "$build/psm-fuzz" "$obj/.libs/libpsm.so" -Wl,-rpath,"$obj/.libs" $(pkg-config --libs glib-2.0 libconfig json-glib-1.0) \
  || { echo "fuzz/run.sh: cannot link the fuzzer"; exit 2; }
export PSM_PLUGIN_PATH="$obj/plugins/.libs"
# the targets' files on a memory file system where there is one
[ -z "${PSM_FUZZ_TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] && PSM_FUZZ_TMPDIR=/dev/shm
export TMPDIR="${PSM_FUZZ_TMPDIR:-${TMPDIR:-/tmp}}"
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export LSAN_OPTIONS=suppressions=$top/fuzz/lsan.supp
cd "$top"   # pipelines name their data relative to the project root
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), clang $(clang -dumpversion), $secs s a target, inputs up to $max_len bytes"
printf '%-12s %12s %8s %10s %8s %s\n' target executions seconds exec/s corpus result
status=0
one () {
  t=$1
  mkdir -p "$build/$t/new" "$top/fuzz/corpus/$t"
  leaks=1
  [ "$t" = pipeline ] && leaks=0
  PSM_FUZZ_TARGET=$t "$build/psm-fuzz" -max_total_time="$secs" ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} -max_len="$max_len" \
    -timeout=10 -rss_limit_mb=2048 -detect_leaks=$leaks -close_fd_mask=2 -print_final_stats=1 \
    -artifact_prefix="$build/$t/" "$build/$t/new" "$top/fuzz/corpus/$t" > "$build/$t/log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ $leaks -eq 0 ]; then   # every input once, leak checks on
    PSM_FUZZ_TARGET=$t "$build/psm-fuzz" -runs=0 -detect_leaks=1 -max_len="$max_len" -timeout=10 -close_fd_mask=2 \
      -artifact_prefix="$build/$t/" "$build/$t/new" "$top/fuzz/corpus/$t" > "$build/$t/leaks.log" 2>&1 || rc=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$build/$t/log" | tail -1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$build/$t/log" | tail -1)
  if [ -z "$took" ]; then   # stopped by a finding: the time from libFuzzer's own rate
    rate=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$build/$t/log" | tail -1)
    took=$(awk -v r="${runs:-0}" -v x="${rate:-0}" -v s="$secs" 'BEGIN { printf "%.0f", (x > 0 ? r / x : s) }')
  fi
  # keep the inputs that reach new code
  PSM_FUZZ_TARGET=$t "$build/psm-fuzz" -merge=1 -max_len="$max_len" -close_fd_mask=2 "$top/fuzz/corpus/$t" "$build/$t/new" \
    > "$build/$t/merge.log" 2>&1
  kept=$(ls "$top/fuzz/corpus/$t" | wc -l)
  if [ $rc -eq 0 ]; then res="no crash, hang or report"; else res="FOUND: see $build/$t/log ($(ls "$build/$t" | grep -E '^(crash|timeout|leak|oom)-' | head -1))"; fi
  printf '%-12s %12s %8s %10s %8s %s\n' "$t" "${runs:-?}" "$took" \
    "$(awk -v r="${runs:-0}" -v s="$took" 'BEGIN { printf "%.0f", (s > 0 ? r / s : 0) }')" "$kept" "$res"
  return $rc
}
# two workers (one per core), each taking every other target in the order
# given, a row printed as each target ends
worker () {   # worker FIRST_INDEX: targets FIRST_INDEX, +2, ...
  k=0 st=0
  for t in $targets; do
    if [ $((k % 2)) -eq "$1" ]; then
      one "$t" > "$build/$t.row" 2>&1 || st=1
      cat "$build/$t.row"
    fi
    k=$((k + 1))
  done
  return $st
}
worker 0 &
w0=$!
worker 1 &
w1=$!
wait $w0 || status=1
wait $w1 || status=1
exit $status
