#!/bin/sh
# psm-run serve against hostile clients (issue 58), on 127.0.0.1 only, every
# attack bounded in count and time: each attack of tests/serve-attack.py,
# then a normal request that must be answered with a summary; the server
# runs under `ulimit -n 256` with --header-timeout 2, stays up through all
# of them, and its peak RSS stays under RSS_BOUND_MB. Prints a table:
# attack, answer, peak RSS (MB), seconds to the next normal answer. Under
# the sanitizers (make check-sanitizers) the memory bounds are reported, not
# asserted: AddressSanitizer's shadow memory and the quarantine of freed
# blocks are in the RSS.
set -u
run="$top_builddir/tools/psm-run"
command -v python3 > /dev/null 2>&1 || { echo "SKIP: python3 is not installed (apt-get install python3)"; exit 77; }
RSS_BOUND_MB=300
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-hostile-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill $pid 2> /dev/null; rm -rf "$tmp"' EXIT
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/tiny-summariser.sh"
. "$top_srcdir/tests/serve-url.sh"
[ "$tiny_rc" -eq 0 ] && ok "a tiny summariser to serve" || { cat "$tmp/train.out" > "$tmp/out"; bad "tiny summariser"; }

(ulimit -n 256 && exec "$run" serve "$tmp/run" --port 0 --header-timeout 2 --queue 64 > "$tmp/serve.out" \
   2> "$tmp/serve.err") &
pid=$!
serve_url "$tmp/serve.out" $pid 100 && ok "serve listens under ulimit -n 256 ($url)" || { cat "$tmp/serve.err" > "$tmp/out"; bad "serve starts"; }
port=${url##*:}
port=${port%/}

printf '%-20s %-44s %8s %8s\n' "attack" "answer" "peak MB" "next s" > "$tmp/table"
for a in deep-nesting content-length-1e9 chunked-400MB half-open-300 fd-exhaustion burst-200 one-1MB-word unique-words-1000 \
         hung-up-8 text/plain foreign-host health-path nul-escape; do
  line=$(timeout 300 python3 "$top_srcdir/tests/serve-attack.py" "$port" "$pid" "$a" 2> "$tmp/attack.err")
  rc=$?
  printf '%s\n' "$line" | awk -F '\t' '{ printf "%-20s %-44s %8s %8s %s\n", $1, $2, $3, $4, $5 }' >> "$tmp/table"
  if [ $rc -eq 0 ] && kill -0 $pid 2> /dev/null; then
    ok "$a: answered as it should, and the next request too ($line)"
  else
    { echo "$line"; cat "$tmp/attack.err"; tail -20 "$tmp/serve.err"; } > "$tmp/out"
    bad "$a: ${line:-no answer}"
  fi
done
cat "$tmp/table"
peak=$(awk '/^VmHWM:/ { printf "%d", $2 / 1024 }' /proc/$pid/status 2> /dev/null)
if [ "${PSM_TEST_SANITIZED:-0}" = 1 ]; then
  echo "# peak RSS through every attack: $peak MB (not asserted under the sanitizers)"
else
  [ -n "$peak" ] && [ "$peak" -lt "$RSS_BOUND_MB" ] && ok "peak RSS through every attack: $peak MB (bound $RSS_BOUND_MB MB)" ||
    bad "peak RSS $peak MB is over $RSS_BOUND_MB MB"
fi
health=$(curl -s "${url}health")
case $health in
  *'"dropped_hung_up": 0,'*) echo "    $health" > "$tmp/out"; bad "the hung-up clients' requests were dropped" ;;
  *'"dropped_hung_up": '*) ok "the hung-up clients' requests were dropped ($health)" ;;
  *) echo "    $health" > "$tmp/out"; bad "the hung-up clients' requests were dropped" ;;
esac
grep -q "closed a connection that sent no whole request" "$tmp/serve.err" && ok "the server logs the connections it closed" ||
  bad "the server logs the connections it closed"
kill -TERM $pid; wait $pid; rc=$?; pid=""
[ $rc -eq 0 ] && ok "SIGTERM ends it cleanly after the attacks" || bad "SIGTERM ends it cleanly (exit $rc)"
finish
