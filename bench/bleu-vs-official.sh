#!/bin/sh
# Scores the same hypotheses with psm's bleu metric and with Moses'
# multi-bleu.perl, and prints both (psm-pipeline(5) states the outcome).
#   sh bench/bleu-vs-official.sh MULTI_BLEU_PERL
# MULTI_BLEU_PERL: scripts/generic/multi-bleu.perl from a clone of
# moses-smt/mosesdecoder. References: the French side of Multi30k's
# test_2016_flickr (../shared/data); a second reference file for the
# multi-reference case: the first 1,000 lines of its validation split.
# Hypotheses: the references with about 10 % of the words dropped, 10 %
# replaced and 5 % swapped with the next (awk, fixed seed), then the same
# with 8 % of the words upper-cased to compare -lc / lowercase = true.
set -eu
MB=$1
here=$(cd "$(dirname "$0")/.." && pwd)
data=${PSM_DATA:-$here/../shared/data}/multi30k-en-fr
run=${PSM_RUN:-$here/psm}
export PSM_PLUGIN_PATH=${PSM_PLUGIN_PATH:-$here/plugins/.libs}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$data/test_2016_flickr.lc.norm.tok.fr" "$tmp/ref0"
head -1000 "$data/val.lc.norm.tok.fr" > "$tmp/ref1"
awk 'BEGIN { srand (3) } { n = split ($0, w, " "); s = ""
  for (i = 1; i <= n; i++) { r = rand (); if (r < 0.1) continue; t = w[i]; if (r > 0.9) t = "xx"
    if (r > 0.85 && r <= 0.9 && i < n) { t = w[i + 1] " " w[i]; i++ }
    s = s (s == "" ? "" : " ") t }
  print s }' "$tmp/ref0" > "$tmp/hyp"
awk 'BEGIN { srand (7) } { n = split ($0, w, " "); s = ""
  for (i = 1; i <= n; i++) { t = w[i]; if (rand () < 0.08) t = toupper (t); s = s (s == "" ? "" : " ") t }
  print s }' "$tmp/hyp" > "$tmp/hyp_uc"
show () { echo "== $1"; shift; }
show "one reference"
perl "$MB" "$tmp/ref0" < "$tmp/hyp" 2>/dev/null
"$run" score --metric bleu --sep "" "$tmp/hyp" "$tmp/ref0"
show "two references"
(cd "$tmp" && perl "$MB" ref < hyp 2>/dev/null)
"$run" score --metric bleu --sep "" "$tmp/hyp" "$tmp/ref0" "$tmp/ref1"
show "upper-cased words, case-sensitive"
perl "$MB" "$tmp/ref0" < "$tmp/hyp_uc" 2>/dev/null
"$run" score --metric bleu --sep "" "$tmp/hyp_uc" "$tmp/ref0"
show "upper-cased words, -lc / lowercase = true"
perl "$MB" -lc "$tmp/ref0" < "$tmp/hyp_uc" 2>/dev/null
"$run" score --metric bleu --sep "" --set bleu.lowercase=true "$tmp/hyp_uc" "$tmp/ref0"
