#!/bin/sh
# Scores the same summaries with psm's rouge metric and with the official
# ROUGE-1.5.5 Perl script, and prints both (README/RESULTS state the outcome).
#   sh bench/rouge-vs-official.sh ROUGE_DIR [N]
# ROUGE_DIR holds ROUGE-1.5.5.pl and data/ (e.g. from a clone of a repository
# that ships it); Perl needs XML::DOM (apt-get install libxml-dom-perl). The
# script's WordNet exception database is rebuilt the way pyrouge's
# instructions do (which leaves it empty: current Perl cannot read the
# Berkeley DB 1.85 file it ships). Summaries: lead-3 of the first N (default
# 490) validation articles of ../shared/data/cnndm, and their first 50 words;
# references: the highlights. Options compared: -n 2 -a -m, then with -l 75
# and with -b 75.
set -eu
ROUGE=$1
N=${2:-490}
here=$(cd "$(dirname "$0")/.." && pwd)
data=${PSM_DATA:-$here/../shared/data}/cnndm/valid.jsonl
tmp=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT; echo "work dir $tmp" >&2
mkdir -p "$tmp/data" "$tmp/sys" "$tmp/ref"
cp -r "$ROUGE/data/smart_common_words.txt" "$ROUGE/data/WordNet-2.0-Exceptions" "$tmp/data/"
(cd "$tmp/data" && perl WordNet-2.0-Exceptions/buildExeptionDB.pl ./WordNet-2.0-Exceptions ./smart_common_words.txt \
   ./WordNet-2.0.exc.db > /dev/null)
# one summary and one reference a line (sentences separated by " <q> "),
# and the same as SPL files, one sentence a line, for the Perl script
/usr/bin/python3 - "$data" "$N" "$tmp" <<'PY'
import json, sys
path, n, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
recs = [json.loads(l) for l in open(path, encoding="utf-8")][:n]
def sents(text):
    out, cur = [], []
    for w in text.split():
        cur.append(w)
        if w == ".":
            out.append(" ".join(cur)); cur = []
    if cur: out.append(" ".join(cur))
    return out
for kind in ("lead3", "first50"):
    with open(f"{tmp}/{kind}.txt", "w") as f, open(f"{tmp}/{kind}.xml", "w") as x:
        x.write('<ROUGE_EVAL version="1.55">\n')
        for i, r in enumerate(recs):
            s = sents(r["article"])[:3] if kind == "lead3" else sents(" ".join(r["article"].split()[:50]))
            f.write(" <q> ".join(s) + "\n")
            open(f"{tmp}/sys/{kind}.{i}.txt", "w").write("\n".join(s) + "\n")
            x.write(f'<EVAL ID="{i+1}"><PEER-ROOT>{tmp}/sys</PEER-ROOT><MODEL-ROOT>{tmp}/ref</MODEL-ROOT>'
                    f'<INPUT-FORMAT TYPE="SPL"></INPUT-FORMAT><PEERS><P ID="1">{kind}.{i}.txt</P></PEERS>'
                    f'<MODELS><M ID="A">ref.{i}.txt</M></MODELS></EVAL>\n')
        x.write("</ROUGE_EVAL>\n")
with open(f"{tmp}/ref.txt", "w") as f:
    for i, r in enumerate(recs):
        s = [l.strip() for l in r["highlights"].split("\n") if l.strip()]
        f.write(" <q> ".join(s) + "\n")
        open(f"{tmp}/ref/ref.{i}.txt", "w").write("\n".join(s) + "\n")
PY
for kind in lead3 first50; do
  for opt in "" "-l 75" "-b 75"; do
    echo "== $kind ${opt:-(whole texts)}"
    perl "$ROUGE/ROUGE-1.5.5.pl" -e "$tmp/data" -n 2 -a -m $opt "$tmp/$kind.xml" \
      | awk '/Average_[RPF]/ && !/ROUGE-[SWSU]/ { printf "  official %s %s %.2f\n", $2, $3, 100 * $4 }'
    set --
    case "$opt" in "-l 75") set -- --set rouge.limit_words=75 ;; "-b 75") set -- --set rouge.limit_bytes=75 ;; esac
    "$here/tools/psm-run" score --metric rouge "$@" "$tmp/$kind.txt" "$tmp/ref.txt" | tr -s ' ' '\n' \
      | awk -F'\n' '/^rouge[12L]_[rpf]$/ { name = $1; next } name { printf "  psm      %s %s\n", name, $1; name = "" }'
  done
done | tee "$tmp/both.txt"
# the same 9 values x 6 settings from both: the largest difference
awk '/==/ { sec = $0 }
     /official/ { split($2, a, "-"); m = $3; sub("Average_", "", m); sub(":", "", m); o[sec " " a[2] " " m] = $4 }
     /psm / { n = $2; sub("rouge", "", n); split(n, b, "_"); p[sec " " toupper(b[1]) " " toupper(b[2])] = $3 }
     END { mx = 0; for (k in p) { c++; if (!(k in o)) miss++; d = p[k] - o[k]; if (d < 0) d = -d; if (d > mx) mx = d }
           printf "%d values compared, %d without a counterpart, largest difference %.2f points\n", c, miss, mx }' "$tmp/both.txt"
