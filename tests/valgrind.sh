#!/bin/sh
# make check's programs under valgrind memcheck (issue 10): every Check
# test program (each test in its forked child, as make check runs them; a
# memcheck error makes the child exit 99 and its test fail) and a short psm-run train + decode
# of a tiny pipeline, each with --leak-check=full; an invalid access, an
# uninitialised value used or a definite/indirect leak from libpsm or a
# plugin fails it. Too slow for make check (about 50 times the tests'
# time):
#   sh tests/valgrind.sh [TEST...]        (default: every test program)
# Leaks inside OpenBLAS's and OpenMP's thread pools (allocated once per
# process, never freed) and glib's type system are "still reachable" or
# "possibly lost" and not counted; tests/valgrind.supp names the rest.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
command -v valgrind > /dev/null || { echo "tests/valgrind.sh: apt-get install valgrind"; exit 2; }
# valgrind 3.19 does not know AVX-512: a build of its own for AVX2
# (x86-64-v3) in _valgrind/, from make distdir, and OpenBLAS's AVX2 kernels
v=$top/_valgrind
mkdir -p "$v"
make -C "$top" distdir distdir="$v/src.new" > /dev/null 2>&1 || { echo "tests/valgrind.sh: make distdir failed"; exit 2; }
if [ -d "$v/src" ] && diff -r -q "$v/src" "$v/src.new" > /dev/null; then rm -rf "$v/src.new"
else rm -rf "$v/src" "$v/obj"; mv "$v/src.new" "$v/src"; fi
if [ ! -f "$v/obj/Makefile" ]; then
  mkdir -p "$v/obj"
  (cd "$v/obj" && ../src/configure CFLAGS="-O1 -g -march=x86-64-v3" --without-mpi > configure.log 2>&1) \
    || { echo "configure failed: $v/obj/configure.log"; exit 2; }
fi
(make -C "$v/obj" -j2 && make -C "$v/obj" -j2 check TESTS=) > "$v/make.log" 2>&1 || { echo "build failed: $v/make.log"; exit 2; }
b=$v/obj
s=$top
export OPENBLAS_CORETYPE=Haswell
export PSM_PLUGIN_PATH="$b/plugins/.libs" OMP_NUM_THREADS=1 top_srcdir="$s" top_builddir="$b"
export CK_TIMEOUT_MULTIPLIER=50   # Check's per-test timeouts, for valgrind's slowness
export GLIBCXX_FORCE_NEW=1 G_SLICE=always-malloc
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-valgrind-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
vg="valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect --track-origins=no --error-exitcode=99 --suppressions=$s/tests/valgrind.supp"
if [ $# -eq 0 ]; then
  tests=$(ls "$b"/tests/test-* "$b/tests/fuzz-replay" | grep -v '\.[a-z]*$')
else
  tests=$(for t in "$@"; do echo "$b/tests/$(basename "$t")"; done)
fi
n=0; fails=0
for t in $tests; do
  n=$((n + 1))
  name=$(basename "$t")
  start=$(date +%s)
  (cd "$s" && "$b/libtool" --mode=execute $vg "$t") > "$tmp/$name.log" 2>&1
  rc=$?
  summary=$(grep "ERROR SUMMARY" "$tmp/$name.log" | tail -1 | sed 's/==[0-9]*== //')
  if [ "$rc" -eq 0 ] && grep -q "ERROR SUMMARY: 0" "$tmp/$name.log"; then
    echo "ok $n - $name ($(( $(date +%s) - start )) s): $summary"
  else
    echo "not ok $n - $name: exit $rc; $summary"
    grep -A12 "definitely lost\|Invalid\|uninitialised" "$tmp/$name.log" | head -40 | sed 's/^/    /'
    fails=$((fails + 1))
  fi
done
# psm-run itself: train a tiny pipeline, then decode it
cat > "$tmp/tiny.cfg" <<CFG
task = { plugin = "rarest_word"; vocab = 40; length = 5; pointer_words = 5;
         geometric_p = 0.02; valid_size = 20; test_size = 20; };
model = { embedding = { dim = 8; }; encoder = { plugin = "gru"; hidden = 8; };
          head = { plugin = "pointer_softmax"; location = "summary"; hidden = 8; attn_dim = 8; switch_hidden = 8; }; };
train = { batch = 8; steps = 6; eval_every = 3; log_every = 3; optimizer = { name = "adam"; lr = 0.01; }; };
eval = { batch = 10; };
metrics = ( "error_rate" );
CFG
# under_vg NAME ARGS...: psm-run ARGS under memcheck, from the project root
under_vg () {
  name=$1; shift
  n=$((n + 1))
  (cd "$s" && "$b/libtool" --mode=execute $vg "$b/tools/psm-run" "$@") > "$tmp/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0" "$tmp/$name.log"; then
    echo "ok $n - psm-run $name: $(grep "ERROR SUMMARY" "$tmp/$name.log" | sed 's/==[0-9]*== //')"
  else
    echo "not ok $n - psm-run $name"; tail -30 "$tmp/$name.log" | sed 's/^/    /'; fails=$((fails + 1))
  fi
}
under_vg "--mode all" --mode all "$tmp/tiny.cfg" --set "run.dir=$tmp/run"
under_vg "--mode decode" --mode decode "$tmp/tiny.cfg" --set "run.dir=$tmp/run"
# the tools: learning curves of that run, a page of a decoded record (with
# per-example ROUGE from the rouge plugin)
under_vg plot plot "$tmp/run" -o "$tmp/curves.svg"
under_vg view view "$s/fuzz/corpus/view_record/seed-pointer_generator" -o "$tmp/view.html"
echo "1..$n"
[ $fails -eq 0 ]
