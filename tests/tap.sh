# tests/tap.sh — sourced by the shell tests: numbered "ok N - ..." and
# "not ok N - ..." lines, and at the end the Check-style summary that
# .ci/run's log shows. Needs $tmp (the test's own temporary folder).
n=0
fails=0
ok () { n=$((n + 1)); echo "ok $n - $1"; }
# bad DESCRIPTION [LOG]: a failure, and the end of LOG (default $tmp/out)
bad () {
  n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"
  [ -f "${2:-$tmp/out}" ] && tail -40 "${2:-$tmp/out}" | sed 's/^/    /'
  return 0
}
# expect CODE DESCRIPTION PATTERN -- COMMAND...: runs it (output in
# $tmp/out), checks its exit status and that the output matches PATTERN
expect () {
  code=$1; desc=$2; pat=$3; shift 4
  "$@" > "$tmp/out" 2>&1
  rc=$?
  if [ "$rc" -eq "$code" ] && grep -q -- "$pat" "$tmp/out"; then ok "$desc"; else echo "    (exit $rc, wanted $code; pattern: $pat)"; bad "$desc"; fi
}
# finish: the summary, and the test's exit status
finish () { echo "Checks: $n, Failures: $fails"; [ "$fails" -eq 0 ]; exit $?; }
