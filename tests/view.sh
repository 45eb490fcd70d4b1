#!/bin/sh
# psm-run view and psm-run plot: the per-token JSON of decoding, the page
# built from it (self-contained, data escaped, bad input refused), and the
# page in a real headless browser (Debian's chromium) where one is
# installed: it renders, hovering an output word lights its attention on
# the source, no script error; the learning-curve SVG of one and two runs.
set -u
run="$top_builddir/tools/psm-run"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-view-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/tiny-summariser.sh"
[ "$tiny_rc" -eq 0 ] && ok "a tiny summariser trains and decodes with --json" || { cat "$tmp/train.out" "$tmp/decode.out" > "$tmp/out"; bad "tiny summariser"; }
j="$tmp/run/decode.test.jsonl"
[ "$(wc -l < "$j")" -eq 3 ] && ok "one JSON line per decoded example" || bad "one JSON line per decoded example"
missing=""
for key in '"head": "pointer_generator"' '"tokens": \[' '"copied": \[' '"p_gen": \[' '"attention_weights": \[\[\[' \
           '"coverage": \[' '"source": \["the", "cat"' '"reference": "the cat sat .\\nthe dog ran'; do
  grep -q "$key" "$j" || missing="$missing $key"
done
[ -z "$missing" ] && ok "records hold head, tokens, copied, p_gen, attention weights, coverage, source, reference" \
  || { echo "    missing:$missing"; head -c 600 "$j" > "$tmp/out"; bad "record fields"; }
# coverage = attention summed over the output (weights >= 0.005 listed)
if /usr/bin/python3 -c 'import json' 2> /dev/null; then
  /usr/bin/python3 - "$j" > "$tmp/out" 2>&1 <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    s = [0.0] * len(r["source"])
    for step in r["attention_weights"]:
        for p, w in step:
            s[p] += w
    assert len(r["coverage"]) == len(r["source"]), "coverage length"
    for a, b in zip(s, r["coverage"]):
        assert b + 1e-3 >= a and b - a <= 0.005 * len(r["tokens"]) + 1e-3, (a, b)
    assert len(r["p_gen"]) == len(r["tokens"]) == len(r["copied"]) == len(r["attention_weights"])
    assert all(0.0 <= g <= 1.0 for g in r["p_gen"])
print("consistent")
PY
  grep -q consistent "$tmp/out" && ok "coverage is the attention summed over the output; one gate per token" || bad "coverage and attention agree"
fi

expect 0 "view RUN writes the page and prints mean ROUGE" "view.test.html: 3 examples · mean ROUGE-1/2/L F1" -- "$run" view "$tmp/run"
page="$tmp/run/view.test.html"
grep -q '"rouge": {"rouge1_f": ' "$page" && ok "per-example ROUGE in the page" || bad "per-example ROUGE in the page"
if grep -E -i -q '(src|href) *= *"?(https?:)?//|@import|url\(' "$page"; then bad "the page fetches nothing from the network"
else ok "the page fetches nothing from the network"; fi
expect 0 "view FILE.jsonl -o PAGE --examples 1" "1 example" -- "$run" view "$j" -o "$tmp/one.html" --examples 1
[ "$(grep -c '"example": ' "$tmp/one.html")" -eq 1 ] && ok "--examples 1: one example in the page" || bad "--examples 1"
# text that would end the script element stays data
sed '1s|"reference": "[^"]*"|"reference": "</script><script>document.title=\\"pwned\\"</script> <!-- x"|' "$j" > "$tmp/evil.jsonl"
expect 0 "a reference holding </script> is written" "3 examples" -- "$run" view "$tmp/evil.jsonl"
grep -q '</script><script>document.title' "$tmp/evil.html" && bad "</script> in the data is escaped" || ok "</script> in the data is escaped"
head -1 "$j" > "$tmp/bad.jsonl" && echo '{"tokens": ["a"], "source": ["b"], "p_gen": [0.5, 0.2]}' >> "$tmp/bad.jsonl"
expect 1 "a malformed record: file, line and what is wrong" "bad.jsonl:2: \"p_gen\" has 2 entries, expected 1" -- "$run" view "$tmp/bad.jsonl"
[ ! -e "$tmp/bad.html" ] && ok "no page is written from bad input" || bad "no page is written from bad input"
echo '{"tokens": ["a"], "source": ' > "$tmp/bad2.jsonl"
expect 1 "a line that is not JSON" "bad2.jsonl:1: not JSON" -- "$run" view "$tmp/bad2.jsonl"
echo 'not json' > "$tmp/bad2.jsonl"
expect 1 "a line that is no object" "bad2.jsonl:1: not a JSON object" -- "$run" view "$tmp/bad2.jsonl"
# json-glib alone takes the first of several values, and loses the others
# (found by the view_record fuzzer and by valgrind on its corpus)
echo '{"tokens": ["a"], "source": ["b"], "reference": "a"}{}' > "$tmp/bad3.jsonl"
expect 1 "a record with a second value after it" "bad3.jsonl:1: text after the record's closing brace" -- "$run" view "$tmp/bad3.jsonl"
echo '1 {"tokens": ["a"], "source": ["b"], "reference": "a"}' > "$tmp/bad3.jsonl"
expect 1 "a record after another value" "bad3.jsonl:1: not a JSON object" -- "$run" view "$tmp/bad3.jsonl"
# json-glib reads \u0 and the quote after it as an escape, where the
# string ends for JSON (the view_record fuzzer: UBSan, arithmetic on NULL)
printf '%s\n' '{"tokens": ["a"], "source": ["b"], "reference": "a \u0"0a b"}' > "$tmp/bad3.jsonl"
expect 1 "a malformed \\u escape" 'bad3.jsonl:1: a string escape JSON does not have' -- "$run" view "$tmp/bad3.jsonl"
printf '%s\n' '{"tokens": ["a"], "source": ["b"], "reference": "a \q"}' > "$tmp/bad3.jsonl"
expect 1 "an escape JSON does not have" 'bad3.jsonl:1: a string escape JSON does not have' -- "$run" view "$tmp/bad3.jsonl"
printf '%s\n' '{"tokens": ["a\u00e9\"\\/\b\f\n\r\t"], "source": ["b"], "reference": "a"}' > "$tmp/ok3.jsonl"
expect 0 "every escape JSON has" "1 example " -- "$run" view "$tmp/ok3.jsonl"
mkdir "$tmp/empty"
expect 1 "a run never decoded with --json: what to do" "decode with --json first" -- "$run" view "$tmp/empty"
expect 2 "view without a run" "expected one run folder or .jsonl file" -- "$run" view
expect 2 "view --split other" "expected valid or test" -- "$run" view --split train "$tmp/run"

# a language model's per-word records: pages of words shaded by the sentinel gate
awk 'BEGIN { srand (3); for (l = 0; l < 300; l++) { n = 3 + int (rand () * 8); k = int (rand () * 20); s = "";
  for (i = 0; i < n; i++) s = s (i ? " " : "") "w" ((k + i) % 20); print s } }' > "$tmp/lm.train.txt"
head -40 "$tmp/lm.train.txt" > "$tmp/lm.valid.txt"
cat > "$tmp/lm.cfg" <<CFG
task = { plugin = "lm"; train = "$tmp/lm.train.txt"; valid = "$tmp/lm.valid.txt"; test = "$tmp/lm.valid.txt"; bptt = 10; };
model = { embedding = { dim = 16; }; encoder = { plugin = "lstm_lm"; hidden = 16; layers = 1; };
          head = { plugin = "pointer_sentinel"; window = 8; }; };
train = { batch = 8; steps = 40; eval_every = 40; log_every = 20; optimizer = { name = "adam"; lr = 0.01; }; };
eval = { batch = 5; };
run = { dir = "$tmp/lmrun"; };
metrics = ( "perplexity" );
CFG
"$run" "$tmp/lm.cfg" --quiet > /dev/null 2>&1 && "$run" "$tmp/lm.cfg" --mode decode > /dev/null 2>&1
expect 0 "view of a language model's run: its per-word records in pages" "words in [0-9]* pages of 100 · perplexity" -- \
  "$run" view "$tmp/lmrun"
lmpage="$tmp/lmrun/view.test.html"
grep -q '"lm": true, "perplexity": ' "$lmpage" && grep -q '"logp": \[-' "$lmpage" && grep -q '"p_gen": \[0\.' "$lmpage" \
  && ok "pages hold words, log p and the sentinel gate" || bad "LM page contents"
printf '0\tw1\t-1.5\t0.5\n1\tw2\tbad\t0.5\n' > "$tmp/badlm.txt"
expect 1 "a malformed per-word record: file and line" "badlm.txt:2: expected" -- "$run" view "$tmp/badlm.txt"

# learning curves
expect 0 "plot RUN: RUN/curves.svg" "curves.svg: 1 run, loss and" -- "$run" plot "$tmp/run"
grep -q '<polyline class="curve" stroke="#1f77b4" data-run="0" data-series="loss (train)"' "$tmp/run/curves.svg" \
  && grep -q 'data-series="loss (valid)"' "$tmp/run/curves.svg" && ok "training and validation loss curves" || bad "loss curves"
"$run" "$tmp/sum.cfg" --quiet --set "run.dir=\"$tmp/run2\"" --set train.seed=7 > /dev/null 2>&1
expect 0 "plot two runs into one file" "2 runs" -- "$run" plot "$tmp/run" "$tmp/run2" -o "$tmp/two.svg"
grep -q 'data-run="1"' "$tmp/two.svg" && grep -q ">$tmp/run2" "$tmp/two.svg" && ok "a colour and a legend entry per run" || bad "two runs"
printf '%s\n' '{"step": 1, "split": "train", "time": 1.0, "loss": 2.0}' '{"step": 2, "split": "train", "time": 2.0, "loss": 1.5}' \
  '{"step": 2, "split": "valid", "time": 2.1, "loss": 1.7, "examples": 5, "rouge1_f": 10.5}' \
  '{"step": 3, "split": "train", "time": 0.5, "loss": 1.4}' '{"step": 4, "split": "train", "time": 0.9, "loss": 1.3}' \
  '{"step": 4, "split": "valid", "time": 1.0, "loss": 1.6, "examples": 5, "rouge1_f": 12.25}' \
  '{"step": 4, "split": "test", "time": 1.2, "loss": 1.6, "examples": 5, "rouge1_f": 11}' > "$tmp/made.jsonl"
expect 0 "plot a log with a metric, a restart and a test record" "loss and 1 metric" -- "$run" plot "$tmp/made.jsonl" -o "$tmp/made.svg"
grep -q 'data-series="rouge1_f"' "$tmp/made.svg" && grep -c 'class="restart"' "$tmp/made.svg" | grep -q '^2$' \
  && grep -q 'test at update 4 (5 examples): rouge1_f 11<' "$tmp/made.svg" \
  && ok "a metric panel, the restart marked in both panels, the test metrics in the legend" || { cp "$tmp/made.svg" "$tmp/out"; bad "metric, restart, test"; }
expect 1 "plot a folder without log.jsonl" "log.jsonl" -- "$run" plot "$tmp/empty"
printf '{"step": 1, "split": "train", "loss": 2.0}\nnot json\n' > "$tmp/badlog.jsonl"
expect 1 "plot a corrupt log: file and line" "badlog.jsonl:2: not a JSON object" -- "$run" plot "$tmp/badlog.jsonl" -o "$tmp/x.svg"
printf '{"step": 1, "split": "train", "loss": 2.0}\n{"step": 2}{"step": 3, "split": "train", "loss": 1.0}\n' > "$tmp/badlog.jsonl"
expect 1 "plot: two values on a line" "badlog.jsonl:2: not a JSON object" -- "$run" plot "$tmp/badlog.jsonl" -o "$tmp/x.svg"
expect 2 "plot without runs" "expected one run folder or more" -- "$run" plot
# a record whose fields have other types (issue 58: "split": 5 crashed plot)
for v in 5 null '[1]'; do
  printf '{"step": 1, "split": "train", "loss": 2.0}\n{"step": 1, "split": %s, "loss": 1.0}\n' "$v" > "$tmp/badlog.jsonl"
  expect 1 "plot: \"split\": $v is refused with file and line" \
    'badlog.jsonl:2: not a record of psm.s log: "step" must be a number and "split" a string' -- \
    "$run" plot "$tmp/badlog.jsonl" -o "$tmp/x.svg"
done
printf '{"step": "1", "split": "train", "loss": 2.0}\n' > "$tmp/badlog.jsonl"
expect 1 "plot: a \"step\" that is a string" 'badlog.jsonl:1: not a record' -- "$run" plot "$tmp/badlog.jsonl" -o "$tmp/x.svg"
# nesting deeper than the readers take (issue 58: 100,000 '[' overflowed json-glib's stack)
{ printf '{"a": '; head -c 100000 /dev/zero | tr '\0' '['; printf '\n'; } > "$tmp/deep.jsonl"
expect 1 "view: 100,000 nested arrays are refused, file and line" \
  "deep.jsonl:1: arrays and objects nested deeper than this reader takes" -- "$run" view "$tmp/deep.jsonl"
{ printf '{"step": 1, "split": "train", "loss": 2.0}\n{"a": '; head -c 100000 /dev/zero | tr '\0' '['; printf '\n'; } \
  > "$tmp/deeplog.jsonl"
expect 1 "plot: 100,000 nested arrays are refused, file and line" \
  "deeplog.jsonl:2: not a JSON object: arrays and objects nested deeper" -- "$run" plot "$tmp/deeplog.jsonl" -o "$tmp/x.svg"

# a real browser
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "# SKIP: no chromium installed (apt-get install chromium): the page was not opened in a browser"
else
  chrome () { timeout 90 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$tmp/chrome" \
                --enable-logging=stderr --v=0 "$@"; }
  chrome --dump-dom "file://$page?selftest" > "$tmp/dom.html" 2> "$tmp/chrome.err"
  body=$(grep -o '<body[^>]*>' "$tmp/dom.html")
  echo "    $body"
  case $body in *'data-status="rendered 3"'*) ok "chromium renders the page: 3 examples" ;; *) cp "$tmp/chrome.err" "$tmp/out"; bad "chromium renders the page" ;; esac
  case $body in *'data-selftest="pass'*) ok "hovering an output word lights its attention on the source" ;; *) bad "hover lights the attention" ;; esac
  case $body in *data-errors*) bad "no script errors" ;; *) ok "no script errors" ;; esac
  grep -q 'class="tok copied"\|class="tok"' "$tmp/dom.html" && grep -q 'data-attention="\[\[' "$tmp/dom.html" \
    && ok "output words carry their attention for hover" || bad "output words carry their attention"
  if grep -E "Uncaught|CONSOLE.*(Error|error)" "$tmp/chrome.err" > "$tmp/out"; then bad "no console errors"; else ok "no console errors"; fi
  chrome --dump-dom "file://$tmp/evil.html" > "$tmp/evil-dom.html" 2> /dev/null
  grep -q 'data-status="rendered 3"' "$tmp/evil-dom.html" && ! grep -q '<title>pwned' "$tmp/evil-dom.html" \
    && ok "a reference holding </script> renders as text" || bad "a reference holding </script> renders as text"
  # read-again weights: a record with "importance" underlines its source words
  if /usr/bin/python3 -c 'import json' 2> /dev/null; then
    head -1 "$j" | /usr/bin/python3 -c 'import json, sys
r = json.loads(sys.stdin.readline())
r["importance"] = [round((i % 10) / 10, 2) for i in range(len(r["source"]))]
print(json.dumps(r))' > "$tmp/imp.jsonl"
    "$run" view "$tmp/imp.jsonl" > /dev/null 2>&1
    chrome --dump-dom "file://$tmp/imp.html" > "$tmp/imp-dom.html" 2> /dev/null
    grep -q 'border-bottom-color: rgba(120, 40, 160, 0.9)' "$tmp/imp-dom.html" && grep -q 'title="importance 0.900' "$tmp/imp-dom.html" \
      && ! grep -q 'id="implegend" class="hidden"\|class="hidden" id="implegend"' "$tmp/imp-dom.html" \
      && ok "chromium: read-again importance underlines the source words" || bad "importance shown"
  fi
  chrome --dump-dom "file://$lmpage?selftest" > "$tmp/lmdom.html" 2> /dev/null
  grep -q 'data-selftest="pass: “w[0-9]*”: log p -[0-9.]*; sentinel gate' "$tmp/lmdom.html" \
    && ok "chromium: a language model's word shows its log p and sentinel gate on hover" || { grep -o '<body[^>]*>' "$tmp/lmdom.html" > "$tmp/out"; bad "LM page hover"; }
  chrome --screenshot="$tmp/shot.png" --window-size=1200,900 "file://$page" > /dev/null 2>&1
  [ "$(wc -c < "$tmp/shot.png" 2> /dev/null || echo 0)" -gt 10000 ] && ok "a screenshot of the page" || bad "a screenshot of the page"
  chrome --dump-dom "file://$tmp/two.svg" > "$tmp/svg-dom.html" 2> /dev/null
  grep -q "polyline" "$tmp/svg-dom.html" && ! grep -q "error on line" "$tmp/svg-dom.html" \
    && ok "chromium reads the SVG without error" || bad "chromium reads the SVG"
fi
finish
