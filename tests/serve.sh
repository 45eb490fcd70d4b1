#!/bin/sh
# psm-run serve with real HTTP requests (curl): a summary equal to what
# psm-run --mode decode --input gives for the same text, per-token data,
# 4xx with a message for every malformed request, concurrent requests
# batched and all answered, a client that hangs up does not hurt, the
# page with its text box, localhost only by default, SIGTERM ends it
# cleanly; once in headless chromium (where installed): the page's form
# summarises a text through POST /summarize.
set -u
run="$top_builddir/tools/psm-run"
command -v curl > /dev/null 2>&1 || { echo "SKIP: curl is not installed (apt-get install curl)"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-serve-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill $pid 2> /dev/null; rm -rf "$tmp"' EXIT
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/tiny-summariser.sh"
. "$top_srcdir/tests/serve-url.sh"
[ "$tiny_rc" -eq 0 ] && ok "a tiny summariser to serve" || { cat "$tmp/train.out" > "$tmp/out"; bad "tiny summariser"; }

# start: port 0 = any free port, printed
start () {
  : > "$tmp/serve.out"
  "$run" serve "$tmp/run" --port 0 "$@" > "$tmp/serve.out" 2> "$tmp/serve.err" &
  pid=$!
  serve_url "$tmp/serve.out" $pid 100 && return 0
  cat "$tmp/serve.err" > "$tmp/out"
  return 1
}
stop () { kill -TERM $pid; wait $pid; rc=$?; pid=""; return $rc; }
# post BODY: status code to $tmp/code, body to $tmp/out
post () { curl -s -o "$tmp/out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' --data-binary "$1" "${url}summarize" > "$tmp/code"; }
expect_status () {   # expect_status CODE DESCRIPTION PATTERN BODY
  post "$4"
  if [ "$(cat "$tmp/code")" = "$1" ] && grep -q -- "$3" "$tmp/out"; then ok "$2"; else echo "    (status $(cat "$tmp/code"), wanted $1)"; bad "$2"; fi
}

# (serve reads no data split: a validation file that is not jsonl is not opened)
start --batch-wait 300 --set "task.valid=$tmp/sum.cfg" && ok "serve listens ($url)" || bad "serve starts"
case $url in http://127.0.0.1:*) ok "it binds to 127.0.0.1 by default" ;; *) bad "it binds to 127.0.0.1 by default" ;; esac
text="The cat sat on the mat. The dog ran in the park 3. Birds sang."
expect_status 200 "POST /summarize: a summary" '"summary": "' "{\"text\": \"$text\", \"beam\": 3, \"min_len\": 2, \"max_len\": 6}"
for key in '"tokens": \[' '"copied": \[' '"p_gen": \[' '"attention_weights": \[' '"coverage": \[' '"source": \["the", "cat"' \
           '"seconds": ' '"beam": 3'; do
  grep -q "$key" "$tmp/out" || { echo "    missing $key"; bad "the answer carries per-token copy and attention data"; break; }
done && ok "the answer carries per-token copy and attention data"
served=$(sed 's/.*"summary": "\([^"]*\)".*/\1/' "$tmp/out")
echo "$text" | "$run" "$tmp/sum.cfg" --mode decode --input - --set decode.beam=3 --set decode.min_len=2 \
  --set decode.max_len=6 > "$tmp/cli.txt" 2> /dev/null
[ -n "$served" ] && [ "$served" = "$(cat "$tmp/cli.txt")" ] && ok "the same summary as psm-run --mode decode --input ($served)" \
  || { echo "    served: $served; psm-run: $(cat "$tmp/cli.txt")"; bad "the same summary as --mode decode --input"; }
expect_status 400 "a body that is not JSON: 400" '"error": "the body is not JSON' '{"text": '
expect_status 400 "a JSON array: 400" 'must be a JSON object' '["text"]'
expect_status 400 "two JSON values: 400 (json-glib alone would take the first)" 'must be one JSON object' \
  '{"text": "a b"} {"text": "c"}'
expect_status 400 "a value before the object: 400" 'must be one JSON object' '1 {"text": "a b"}'
expect_status 400 "a malformed \\u escape: 400" 'a string escape JSON does not have' '{"text": "a \u0"0a b"}'
expect_status 400 "an empty body: 400" '"error": "the body' ''
expect_status 400 "no text: 400" '\\"text\\" (a string) is required' '{"beam": 2}'
expect_status 400 "an empty text: 400" 'is empty' '{"text": "   "}'
expect_status 400 "an unknown field: 400 naming it" 'unknown field \\"beams\\"' '{"text": "a b", "beams": 2}'
expect_status 400 "beam out of range: 400" '\\"beam\\" = 0 is outside \[1, 64\]' '{"text": "a b", "beam": 0}'
expect_status 400 "a length that is not an integer: 400" '\\"max_len\\" must be an integer' '{"text": "a b", "max_len": "9"}'
expect_status 400 "min_len above max_len: 400" 'min_len 7 is above max_len 3' '{"text": "a b", "min_len": 7, "max_len": 3}'
code=$(curl -s -o "$tmp/out" -w '%{http_code}' "${url}summarize")
[ "$code" = 405 ] && grep -q "POST a JSON object" "$tmp/out" && ok "GET /summarize: 405" || bad "GET /summarize: 405"
code=$(curl -s -o "$tmp/out" -w '%{http_code}' "${url}nothing")
[ "$code" = 404 ] && grep -q "no such page: /nothing" "$tmp/out" && ok "an unknown path: 404" || bad "an unknown path: 404"
code=$(curl -s -o "$tmp/out" -w '%{http_code}' "${url}health")
[ "$code" = 200 ] && grep -q '"status": "ok", "checkpoint": ' "$tmp/out" && ok "GET /health" || bad "GET /health"
code=$(curl -s -o "$tmp/page.html" -w '%{http_code}' "$url")
[ "$code" = 200 ] && grep -q 'id="text"' "$tmp/page.html" && grep -q '"mode": "serve"' "$tmp/page.html" \
  && ok "GET /: the page with its text box" || bad "GET /: the page"

# 8 clients at once: all answered, the same summary each, batched
clients=""
for i in 1 2 3 4 5 6 7 8; do
  curl -s -X POST -H "Content-Type: application/json" --data-binary "{\"text\": \"$text\", \"beam\": 3, \"min_len\": 2, \"max_len\": 6}" "${url}summarize" \
    -o "$tmp/c$i" -w '%{http_code}' > "$tmp/code$i" &
  clients="$clients $!"
done
wait $clients
good=0 maxb=0
for i in 1 2 3 4 5 6 7 8; do
  [ "$(cat "$tmp/code$i")" = 200 ] && grep -q "\"summary\": \"$served\"" "$tmp/c$i" && good=$((good + 1))
  b=$(sed -n 's/.*"batch": \([0-9]*\).*/\1/p' "$tmp/c$i"); [ "${b:-0}" -gt "$maxb" ] && maxb=$b
done
[ "$good" -eq 8 ] && ok "8 concurrent requests: all 200 with the same summary" || bad "8 concurrent requests ($good good)"
[ "$maxb" -ge 2 ] && ok "concurrent requests are decoded in batches (largest: $maxb; eval.batch 4)" || bad "batched (largest $maxb)"
# a client that hangs up while its request waits
curl -s -m 0.1 -X POST -H "Content-Type: application/json" --data-binary "{\"text\": \"$text\"}" "${url}summarize" > /dev/null 2>&1
sleep 0.5
expect_status 200 "after a client hung up, the next request is answered" '"summary": "' "{\"text\": \"$text\"}"
stop && ok "SIGTERM stops it with status 0" || bad "SIGTERM stops it cleanly"
grep -q "served [0-9]* requests" "$tmp/serve.err" && ok "it says how many requests it served" || bad "served count"

# limits
start --max-body 200 --batch-wait 0 || bad "serve starts again"
big=$(head -c 1000 /dev/zero | tr '\0' 'a')
expect_status 413 "a body over --max-body: 413" 'at most 200 are accepted' "{\"text\": \"$big\"}"
expect_status 200 "a small body is still served" '"summary": "' '{"text": "the cat sat ."}'
stop
"$run" serve "$tmp/run" --host not-an-address --port 0 > "$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "not an IP address" "$tmp/out" && ok "--host that is not an address: 2" || bad "--host check"
mkdir "$tmp/nothing" && "$run" serve "$tmp/nothing" > "$tmp/out" 2>&1
[ $? -ne 0 ] && grep -q "pipeline.cfg" "$tmp/out" && ok "a folder that is no run: an error naming its pipeline.cfg" || bad "no run"

browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "# SKIP: no chromium installed (apt-get install chromium): the page was not tried in a browser"
else
  start --batch-wait 0 || bad "serve starts for chromium"
  timeout 90 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$tmp/chrome" \
    --virtual-time-budget=20000 --enable-logging=stderr --v=0 --dump-dom "${url}?selftest" > "$tmp/dom.html" 2> "$tmp/chrome.err"
  body=$(grep -o '<body[^>]*>' "$tmp/dom.html")
  echo "    $body"
  case $body in *'data-summarized="yes"'*) ok "chromium: the page's form summarises a text" ;; *) cp "$tmp/chrome.err" "$tmp/out"; bad "chromium: the form summarises" ;; esac
  case $body in *data-errors*) bad "chromium: no script errors" ;; *) ok "chromium: no script errors" ;; esac
  grep -q 'data-attention="\[\[' "$tmp/dom.html" && ok "chromium: the served summary's words carry attention" || bad "served words carry attention"
  stop
fi
finish
