#!/bin/sh
# psm-run convert on small files made here in each form CNN/DailyMail is
# shared in (See et al.'s length-prefixed tf.Example .bin chunks, the
# Hugging Face export as JSON lines and as CSV): exact output, skipped
# records counted, corrupt files named with the record and byte, an
# existing output never overwritten, and the cnndm task trains on the result.
set -u
run="$top_builddir/tools/psm-run"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-convert-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$top_srcdir/tests/tap.sh"

# See's records: an 8-byte little-endian length, then a tf.Example with the
# bytes features article and abstract (protobuf written by hand: no
# TensorFlow needed). Record 2 has an empty abstract (skipped); a float
# feature and an unknown field must be skipped over.
python3 - "$tmp" <<'PY'
import struct, sys
def varint(n):
    out = b""
    while True:
        b = n & 0x7f; n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n: return out
def ld(field, payload): return varint(field << 3 | 2) + varint(len(payload)) + payload
def feature_bytes(*vals): return ld(1, b"".join(ld(1, v.encode()) for v in vals))
def feature_float(x): return ld(2, ld(1, struct.pack("<f", x)))
def example(feats):
    entries = b"".join(ld(1, ld(1, k.encode()) + ld(2, v)) for k, v in feats)
    return ld(1, entries) + varint(2 << 3 | 0) + varint(7)   # + an unknown varint field
recs = [
  example([("article", feature_bytes("marseille , france -lrb- cnn -rrb- the french prosecutor said ...")),
           ("score", feature_float(0.5)),
           ("abstract", feature_bytes("<s> prosecutor : video shows the crash . </s> <s> the jet crashed . </s>"))]),
  example([("article", feature_bytes("an article without a summary .")), ("abstract", feature_bytes(""))]),
  example([("abstract", feature_bytes("<s> last one . </s>")), ("article", feature_bytes("the third article ."))]),
]
with open(sys.argv[1] + "/train_000.bin", "wb") as f:
    for r in recs: f.write(struct.pack("<q", len(r)) + r)
data = open(sys.argv[1] + "/train_000.bin", "rb").read()
open(sys.argv[1] + "/cut.bin", "wb").write(data[:-5])                       # the last record cut short
open(sys.argv[1] + "/huge.bin", "wb").write(struct.pack("<q", 1 << 40) + b"x")   # an absurd length
open(sys.argv[1] + "/notpb.bin", "wb").write(struct.pack("<q", 3) + b"\xff\xff\xff")
PY

expect 0 "See's .bin: records converted, an empty abstract skipped" \
  "train_000.bin: 2 records, skipped 1 (first: record 2: no summary)" -- "$run" convert -o "$tmp/see.jsonl" "$tmp/train_000.bin"
cat > "$tmp/see.want" <<'EOF'
{"id": "train_000.bin:1", "article": "marseille , france -lrb- cnn -rrb- the french prosecutor said ...", "highlights": "prosecutor : video shows the crash .\nthe jet crashed ."}
{"id": "train_000.bin:3", "article": "the third article .", "highlights": "last one ."}
EOF
cmp -s "$tmp/see.want" "$tmp/see.jsonl" && ok "See's .bin: the tokenised text kept, sentences one a line" \
  || bad "See's .bin: the tokenised text kept, sentences one a line" "$tmp/see.jsonl"
expect 1 "a .bin cut short names the record and byte" "cut.bin: record 3 at byte [0-9]*: the file ends inside the record" -- \
  "$run" convert -o "$tmp/cut.jsonl" "$tmp/cut.bin"
[ ! -e "$tmp/cut.jsonl" ] && [ -z "$(ls "$tmp" | grep 'cut.jsonl.tmp')" ] && ok "and leaves no output file" || bad "and leaves no output file"
expect 1 "an absurd record length is refused before allocating" "huge.bin: record 1 at byte 0: length 1099511627776 is over" -- \
  "$run" convert "$tmp/huge.bin"
expect 1 "a record that is not a tf.Example" "notpb.bin: record 1 at byte 0: not a tf.Example" -- "$run" convert "$tmp/notpb.bin"

# The Hugging Face export: raw, cased text; highlights joined by newlines.
cat > "$tmp/hf.jsonl" <<'EOF'
{"article": "LONDON (CNN) -- The \"big\" cat didn't run, said 3,000 people.", "highlights": "The cat didn't run.\nIt's 3.5 kg", "id": "abc123"}
not json
{"article": "", "highlights": "an empty article"}

{"highlights": "No id here.", "article": "Text."}
EOF
expect 0 "HF JSON lines: bad and empty records skipped with their lines" \
  "hf.jsonl: 2 records, skipped 2 (first: line 2: invalid JSON)" -- "$run" convert -o "$tmp/hf.out.jsonl" "$tmp/hf.jsonl"
cat > "$tmp/hf.want" <<EOF
{"id": "abc123", "article": "london ( cnn ) -- the \`\` big '' cat did n't run , said 3,000 people .", "highlights": "the cat did n't run .\nit 's 3.5 kg"}
{"id": "$tmp/hf.jsonl:5", "article": "text .", "highlights": "no id here ."}
EOF
cmp -s "$tmp/hf.want" "$tmp/hf.out.jsonl" && ok "HF JSON lines: tokenised and lower-cased as psm's raw-text tokeniser" \
  || bad "HF JSON lines: tokenised and lower-cased as psm's raw-text tokeniser" "$tmp/hf.out.jsonl"

# CSV: quoted fields with commas, "" and a newline; columns found by name.
printf 'id,article,highlights\r\nx1,"He said ""no"", then left.","First.\nSecond."\r\nx2,plain article,plain summary\r\nx3,only two fields\r\n' > "$tmp/hf.csv"
expect 0 "HF CSV: quoted fields, a short row skipped" "hf.csv: 2 records, skipped 1 (first: line 5: fewer fields than the header)" -- \
  "$run" convert -o "$tmp/csv.jsonl" "$tmp/hf.csv"
cat > "$tmp/csv.want" <<'EOF'
{"id": "x1", "article": "he said `` no '' , then left .", "highlights": "first .\nsecond ."}
{"id": "x2", "article": "plain article", "highlights": "plain summary"}
EOF
cmp -s "$tmp/csv.want" "$tmp/csv.jsonl" && ok "HF CSV: the same records as JSON lines would give" || bad "HF CSV: the same records" "$tmp/csv.jsonl"
printf 'article,summary\na,b\n' > "$tmp/nohl.csv"
expect 1 "a CSV without the highlights column" "nohl.csv: line 1: expected a header row naming the columns article and highlights" -- \
  "$run" convert "$tmp/nohl.csv"
printf 'article,highlights\n"never closed,x\n' > "$tmp/open.csv"
expect 1 "an unterminated quote names its line" "open.csv: line 2: a quoted field is not closed" -- "$run" convert "$tmp/open.csv"

# the output is never overwritten; inputs in order; --max
echo keep > "$tmp/exists.jsonl"
expect 1 "an existing output file is refused" "exists.jsonl: exists; psm-run convert never overwrites" -- \
  "$run" convert -o "$tmp/exists.jsonl" "$tmp/hf.csv"
[ "$(cat "$tmp/exists.jsonl")" = keep ] && ok "and kept as it was" || bad "an existing output file is kept"
expect 0 "several inputs, --max" "3 records written to" -- "$run" convert --max 3 -o "$tmp/all.jsonl" \
  "$tmp/train_000.bin" "$tmp/hf.csv"
[ "$(cut -c1-16 "$tmp/all.jsonl" | tr '\n' ' ')" = '{"id": "train_00 {"id": "train_00 {"id": "x1", "ar ' ] \
  && ok "in the order given" || bad "several inputs in the order given" "$tmp/all.jsonl"
expect 2 "an unknown extension asks for --format" "say its format with --format" -- "$run" convert "$tmp/see.want"
expect 2 "a bad --tokenize" "expected yes, no or auto" -- "$run" convert --tokenize maybe "$tmp/hf.csv"
expect 0 "--format and --tokenize no" "2 records written" -- "$run" convert --format csv --tokenize no "$tmp/hf.csv"
grep -q '"He said \\"no\\", then left."' "$tmp/out" && ok "--tokenize no keeps the text" || bad "--tokenize no keeps the text"

# records at the 64 MiB bound: a longer JSON line or CSV row is skipped
# with its line, the next record still read, in bounded memory (1 GiB of
# address space for the whole process; not under the sanitizers, whose
# shadow memory needs terabytes of address space: there the messages and
# the skip are checked, the bound is not)
if [ -n "${PSM_TEST_SANITIZED:-}" ]; then lim=; echo "# under the sanitizers: no ulimit -v"
else lim='ulimit -v 1048576;'; fi
python3 - "$tmp" <<'PY'
import sys
big = "x " * (32 * 1024 * 1024 + 8)   # 64 MiB + 16 bytes of text
with open(sys.argv[1] + "/big.jsonl", "w") as f:
    f.write('{"article": "%s", "highlights": "h"}\n{"article": "after", "highlights": "it ."}\n' % big)
with open(sys.argv[1] + "/big.csv", "w") as f:
    f.write('article,highlights\n"%s",h\nafter,it .\n' % big)
PY
expect 0 "a JSON line over 64 MiB is skipped, the next one read" \
  "big.jsonl: 1 records, skipped 1 (first: line 1: longer than 67108864 bytes)" -- \
  sh -c "$lim"'exec "$0" convert -o "$1" "$2"' "$run" "$tmp/big.out.jsonl" "$tmp/big.jsonl"
expect 0 "a CSV row over 64 MiB is skipped, the next one read" \
  "big.csv: 1 records, skipped 1 (first: line 2: a row longer than 67108864 bytes)" -- \
  sh -c "$lim"'exec "$0" convert "$1"' "$run" "$tmp/big.csv"
rm -f "$tmp/big.jsonl" "$tmp/big.csv"

# the cnndm task trains, validates and decodes on the converted files
expect 0 "the cnndm task reads the converted files (--check)" "check: OK" -- "$run" --check \
  "$top_srcdir/pipelines/cnndm_coverage_mini.cfg" --set "task.train=$tmp/all.jsonl" --set "task.valid=$tmp/csv.jsonl"
finish
