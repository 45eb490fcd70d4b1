#!/bin/sh
# psm-run serve under load: requests/s and latency (mean, median, 90th
# percentile) with 1 and with 8 concurrent clients, each request one
# held-out CNN/DailyMail article (valid.jsonl) summarised with the run's
# decode settings; beside it, the same articles through
# psm-run --mode decode --input (one process, batches of eval.batch /
# beam) for the throughput without HTTP. From the build tree, after
# training the run:
#   sh bench/serve.sh [RUN_DIR] [REQUESTS]   (default runs/cnndm_coverage_mini, 48)
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
runDir=${1:-runs/cnndm_coverage_mini}
N=${2:-48}
data="${PSM_DATA:-$top/../shared/data}/cnndm/valid.jsonl"
unset OPENBLAS_CORETYPE
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-bench-serve-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill $pid 2> /dev/null; rm -rf "$tmp"' EXIT
. "$top/bench/machine.sh"
machine_line
echo "# $("$top/psm" --version); $(curl --version | head -1 | cut -d' ' -f1-2); OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
# the last N articles of the validation file, one request body each
/usr/bin/python3 - "$data" "$N" "$tmp" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()[-int(sys.argv[2]):]
with open(sys.argv[3] + "/articles.txt", "w") as raw:
    for i, line in enumerate(lines):
        art = json.loads(line)["article"].replace("\n", " ")
        json.dump({"text": art}, open("%s/body%d.json" % (sys.argv[3], i + 1), "w"))
        raw.write(art + "\n")
PY
"$top/psm" serve "$runDir" --port 0 --quiet > "$tmp/serve.out" 2> "$tmp/serve.err" &
pid=$!
. "$top/tests/serve-url.sh"
serve_url "$tmp/serve.out" $pid 300 || { cat "$tmp/serve.err"; exit 1; }
echo "# run: $runDir ($(sed -n 's/.*(checkpoint \([^,]*\), update \([0-9]*\)).*/\1, update \2/p' "$tmp/serve.out")); $N articles"
curl -s "$url" > /dev/null   # warm up: the first request pays for nothing but itself
curl -s -X POST -H "Content-Type: application/json" --data-binary @"$tmp/body1.json" "${url}summarize" > /dev/null
load () {   # load CLIENTS: every client posts its share of the N articles in turn
  c=$1
  start=$(date +%s.%N)
  pids=""
  for k in $(seq 1 "$c"); do
    (i=$k; while [ "$i" -le "$N" ]; do
       curl -s -o /dev/null -w '%{time_total}\n' -X POST -H 'Content-Type: application/json' \
         -H "Content-Type: application/json" --data-binary @"$tmp/body$i.json" "${url}summarize"
       i=$((i + c))
     done) > "$tmp/lat$c.$k" &
    pids="$pids $!"
  done
  wait $pids
  end=$(date +%s.%N)
  cat "$tmp"/lat"$c".* | sort -n > "$tmp/lat$c"
  awk -v c="$c" -v s="$start" -v e="$end" '{ v[NR] = $1; sum += $1 } END {
    printf "%d client%s: %d requests in %.1f s = %.3f requests/s; latency mean %.2f s, median %.2f s, 90%% %.2f s\n",
      c, c == 1 ? "" : "s", NR, e - s, NR / (e - s), sum / NR, v[int((NR + 1) / 2)], v[int(0.9 * NR + 0.999)] }' "$tmp/lat$c"
}
load 1
load 8
kill -TERM $pid; wait $pid || true; pid=""
cfg="$runDir/pipeline.cfg"
start=$(date +%s.%N)
"$top/psm" "$cfg" --set "run.dir=\"$runDir\"" --mode decode --input "$tmp/articles.txt" > /dev/null 2> "$tmp/cli.err"
end=$(date +%s.%N)
awk -v n="$N" -v s="$start" -v e="$end" 'BEGIN { printf "psm-run --mode decode --input, same articles: %.1f s = %.3f articles/s (model load included)\n", e - s, n / (e - s) }'
