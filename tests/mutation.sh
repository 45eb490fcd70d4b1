#!/bin/sh
# Mutation test of the gradient checks (issue 10): the backward of each op
# in turn made 1 % wrong (PSM_MUTATE_BACKWARD=NAME: it adds 1.01 times its
# gradient to its inputs), and the checks must fail. In make check: every op
# against tests/test-ops, which checks each op's gradient (and the pointer
# sentinel's two ops against their head's test, which is where they are
# checked). With MUTATION_ALL=1 (sh tests/mutation.sh from the build tree,
# about 20 minutes): every op against every plugin test whose graph runs it
# too, so each plugin's gradient check is shown to see a 1 % error in any
# op it is built from.
set -u
b=${top_builddir:-.}
s=${top_srcdir:-.}
if [ -n "${PSM_TEST_SANITIZED:-}" ]; then
  echo "1..0 # SKIP under sanitizers: the plain build proves the checks (45 test-ops runs)"
  exit 77
fi
export PSM_PLUGIN_PATH="${PSM_PLUGIN_PATH:-$b/plugins/.libs}"
export CK_FORK=no
ops=$(sed -n 's/^ *\[PSM_OP_[A-Z0-9_]*\] *= *{ *"\([a-z_0-9]*\)".*/\1/p; s/^ *{ *"\([a-z_0-9]*\)", *psm_.*/\1/p' "$s/core/ops/op-table.c")
[ -n "$ops" ] || { echo "not ok 1 - no op names read from core/ops/op-table.c"; echo "1..1"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-mutation-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
fails=0
# runs test program $2 with op $1 mutated: "caught", "missed" or "unused"
# ($3: a name for this run's files, so that two can run at once)
verdict () {
  rm -f "$tmp/mark$3"
  PSM_MUTATE_BACKWARD=$1 PSM_MUTATE_MARK="$tmp/mark$3" "$2" > "$tmp/out$3" 2>&1
  rc=$?
  if [ ! -s "$tmp/mark$3" ]; then echo unused
  elif [ $rc -ne 0 ] && grep -q "mismatch" "$tmp/out$3"; then echo caught
  else echo missed; fi
}
# each op's line, into $tmp/line.K (K its number)
op_line () {
  v=$(verdict "$1" "$b/tests/test-ops" "$2")
  where=test-ops
  if [ "$v" != caught ]; then
    v=$(verdict "$1" "$b/tests/test-head-pointer_sentinel" "$2")
    where=test-head-pointer_sentinel
  fi
  if [ "$v" = caught ]; then
    echo "ok $2 - $1: a 1 % error in its backward fails $where"
  else
    echo "not ok $2 - $1: a 1 % error in its backward passes every check ($v)"
  fi > "$tmp/line.$2"
}
# the ops two at a time, one thread each (the machine's 2 cores; about
# half the time of one after the other), printed in order
k=0
for op in $ops; do
  k=$((k + 1))
  OMP_NUM_THREADS=1 op_line "$op" "$k" &
  [ $((k % 2)) -eq 0 ] && wait
done
wait
i=0
while [ $i -lt $k ]; do
  i=$((i + 1))
  cat "$tmp/line.$i"
  grep -q "^not ok" "$tmp/line.$i" && fails=$((fails + 1))
done
n=$k
if [ -n "${MUTATION_ALL:-}" ]; then
  for t in "$b"/tests/test-encoder-* "$b"/tests/test-decoder-* "$b"/tests/test-head-*; do
    case "$t" in *.o|*.c|*.log|*.trs) continue ;; esac
    [ -x "$t" ] || continue
    caught=""; missed=""
    for op in $ops; do
      case $(verdict "$op" "$t" "") in
        caught) caught="$caught $op" ;;
        missed) missed="$missed $op" ;;
      esac
    done
    n=$((n + 1))
    if [ -z "$missed" ]; then
      echo "ok $n - $(basename "$t"): a 1 % error in any of the $(echo $caught | wc -w) ops its graphs run fails it:$caught"
    else
      echo "not ok $n - $(basename "$t"): a 1 % error passes in:$missed (caught:$caught)"
      fails=$((fails + 1))
    fi
  done
fi
echo "1..$n"
[ $fails -eq 0 ]
