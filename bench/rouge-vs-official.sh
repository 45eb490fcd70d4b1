#!/bin/sh
# Scores the same summaries with psm's rouge metric and with the official
# ROUGE-1.5.5 Perl script, and prints both side by side (README/RESULTS
# state the outcome).
#   sh bench/rouge-vs-official.sh ROUGE_DIR [N] [RUN_DIR...]
# ROUGE_DIR holds ROUGE-1.5.5.pl and data/ (e.g. from a clone of a repository
# that ships it); Perl needs XML::DOM and DB_File (apt-get install
# libxml-dom-perl). Summaries: lead-3 of the first N (default 490) held-out
# articles of ../shared/data/cnndm and their first 50 words, against the
# highlights; then, for each RUN_DIR given, psm's own decoded summaries in
# RUN_DIR/decode.test.txt against RUN_DIR/reference.test.txt (all lines).
# Options compared: -n 2 -a -m, then with -l 75 and with -b 75.
#
# The exception database is the standard one: built with the script's own
# buildExeptionDB.pl from WordNet 2.0's adj, adv, noun and verb lists, read
# in that order (the order of the database ROUGE-1.5.5 ships, which current
# Perl cannot open; a later list wins a word two lists share: best -> well).
# The script reads a directory in the file system's order, so each list is
# given to it alone, one after the other. With EMPTY_DB=1 the database is
# built the way pyrouge's instructions do, which reads no list (then compare
# with psm's --set rouge.exceptions=false).
set -eu
ROUGE=$1
N=${2:-490}
shift; [ $# -gt 0 ] && shift
here=$(cd "$(dirname "$0")/.." && pwd)
data=${PSM_DATA:-$here/../shared/data}/cnndm/valid.jsonl
tmp=$(mktemp -d)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT; echo "work dir $tmp" >&2
mkdir -p "$tmp/data" "$tmp/sys" "$tmp/ref"
cp "$ROUGE/data/smart_common_words.txt" "$tmp/data/"
exc=$ROUGE/data/WordNet-2.0-Exceptions
psmset=
if [ -n "${EMPTY_DB:-}" ]; then
  (cd "$tmp/data" && cp -r "$exc" . && perl WordNet-2.0-Exceptions/buildExeptionDB.pl ./WordNet-2.0-Exceptions \
     ./smart_common_words.txt ./WordNet-2.0.exc.db > /dev/null)
  psmset="--set rouge.exceptions=false"
else
  for pos in adj adv noun verb; do
    mkdir "$tmp/exc-$pos" && cp "$exc/$pos.exc" "$tmp/exc-$pos/"
    (cd "$tmp/exc-$pos" && perl "$exc/buildExeptionDB.pl" . exc "$tmp/data/WordNet-2.0.exc.db" > /dev/null)
  done
fi
perl -MDB_File -MFcntl -e 'tie %h, "DB_File", $ARGV[0], O_RDONLY, 0, $DB_HASH or die "cannot open $ARGV[0]\n";
  printf STDERR "exception database: %d words (best -> %s)\n", scalar (keys %h), $h{best} // "itself"' \
  "$tmp/data/WordNet-2.0.exc.db"
# one summary and one reference a line (sentences separated by " <q> "), and
# the same as SPL files, one sentence a line, for the Perl script; a decoded
# summary's sentences also end after each "." (psm's rouge.sentence_end)
/usr/bin/python3 - "$data" "$N" "$tmp" "$@" <<'PY'
import json, sys
path, n, tmp, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def sents(text):
    out, cur = [], []
    for w in text.split():
        if w == "<q>":
            if cur: out.append(" ".join(cur))
            cur = []
            continue
        cur.append(w)
        if w == ".":
            out.append(" ".join(cur)); cur = []
    if cur: out.append(" ".join(cur))
    return out
def write(kind, hyps, refs):
    with open(f"{tmp}/{kind}.txt", "w") as f, open(f"{tmp}/{kind}.ref.txt", "w") as g, \
         open(f"{tmp}/{kind}.xml", "w") as x:
        x.write('<ROUGE_EVAL version="1.55">\n')
        for i, (h, r) in enumerate(zip(hyps, refs)):
            f.write(" <q> ".join(h) + "\n")
            g.write(" <q> ".join(r) + "\n")
            open(f"{tmp}/sys/{kind}.{i}.txt", "w").write("\n".join(h) + "\n")
            open(f"{tmp}/ref/{kind}.{i}.txt", "w").write("\n".join(r) + "\n")
            x.write(f'<EVAL ID="{i+1}"><PEER-ROOT>{tmp}/sys</PEER-ROOT><MODEL-ROOT>{tmp}/ref</MODEL-ROOT>'
                    f'<INPUT-FORMAT TYPE="SPL"></INPUT-FORMAT><PEERS><P ID="1">{kind}.{i}.txt</P></PEERS>'
                    f'<MODELS><M ID="A">{kind}.{i}.txt</M></MODELS></EVAL>\n')
        x.write("</ROUGE_EVAL>\n")
    print(kind)
recs = [json.loads(l) for l in open(path, encoding="utf-8")][:n]
refs = [[l.strip() for l in r["highlights"].split("\n") if l.strip()] for r in recs]
write("lead3", [sents(r["article"])[:3] for r in recs], refs)
write("first50", [sents(" ".join(r["article"].split()[:50])) for r in recs], refs)
for k, run in enumerate(runs):
    hyps = [sents(l) for l in open(f"{run}/decode.test.txt", encoding="utf-8")]
    rr = [[s.strip() for s in l.split("<q>") if s.strip()] for l in open(f"{run}/reference.test.txt", encoding="utf-8")]
    write(f"run{k + 1}", hyps, rr)
PY
[ $# -gt 0 ] && { k=0; for run in "$@"; do k=$((k + 1)); echo "run$k = $run" >&2; done; }
kinds=$(ls "$tmp"/*.xml | sed 's|.*/||; s|\.xml$||' | sort -r)
for kind in $kinds; do
  for opt in "" "-l 75" "-b 75"; do
    echo "== $kind ${opt:-(whole texts)}"
    perl "$ROUGE/ROUGE-1.5.5.pl" -e "$tmp/data" -n 2 -a -m $opt "$tmp/$kind.xml" \
      | awk '/Average_[RPF]/ && !/ROUGE-[SWSU]/ { printf "  official %s %s %.2f\n", $2, $3, 100 * $4 }'
    case "$opt" in "-l 75") lim="--set rouge.limit_words=75" ;; "-b 75") lim="--set rouge.limit_bytes=75" ;; *) lim= ;; esac
    # shellcheck disable=SC2086
    "$here/psm" score --metric rouge $psmset $lim "$tmp/$kind.txt" "$tmp/$kind.ref.txt" | tr -s ' ' '\n' \
      | awk -F'\n' '/^rouge[12L]_[rpf]$/ { name = $1; next } name { printf "  psm      %s %s\n", name, $1; name = "" }'
  done
done | tee "$tmp/both.txt"
# the same 9 values x 3 settings x each set of summaries from both: the
# largest difference
awk '/==/ { sec = $0 }
     /official/ { split($2, a, "-"); m = $3; sub("Average_", "", m); sub(":", "", m); o[sec " " a[2] " " m] = $4 }
     /psm / { n = $2; sub("rouge", "", n); split(n, b, "_"); p[sec " " toupper(b[1]) " " toupper(b[2])] = $3 }
     END { mx = 0; for (k in p) { c++; if (!(k in o)) miss++; d = p[k] - o[k]; if (d < 0) d = -d; if (d > mx) mx = d
                                  if (d > 0.005) diff++ }
           printf "%d values compared, %d without a counterpart, %d differ, largest difference %.2f points\n",
                  c, miss + 0, diff + 0, mx
           exit (c == 0 || miss > 0) }' "$tmp/both.txt"
