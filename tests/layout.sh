#!/bin/sh
# The layout rules of issue 60, checked over the sources (not the build):
#   1. a file under core/ or plugins/ has at most 600 lines, a function at
#      most 150 (from its opening brace in column 0 to its closing one);
#   2. a plugin includes only psm's public headers (<psm/...>), system
#      headers and its own folder's headers — never a core-private one;
#   3. a public header (core/psm/) includes no core-private header;
#   4. the #include graph of the project's own files has no circle;
#   5. the core is layers, each a folder: base < kernels < tape < ops <
#      config < model < run; a file includes no header of a higher layer
#      (public headers, core/psm/, are for all), and no file lies in core/
#      outside them;
#   6. each layer has one internal header, core/L/L-internal.h, of at most
#      200 lines; another header in a layer's folder is listed below with
#      its reason.
# The files and functions that break rule 1 today are listed below, each
# with its reason; an entry that no longer breaks the rule fails the check
# too, so the list only shrinks. Generated files (rouge-exceptions.c) are
# not sources and are left out.
set -u
src=$(cd "${top_srcdir:-.}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-layout-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/tap.sh"
command -v python3 > /dev/null || { echo "1..0 # SKIP python3 is not installed"; exit 77; }

cat > "$tmp/check.py" <<'EOF'
import os, re, sys
src = sys.argv[1]
MAX_FILE, MAX_FUNC = 600, 150
# Known breaches of rule 1, with the reason each stands for now.
FILE_EXCEPTIONS = {}
FUNC_EXCEPTIONS = {}
LAYERS = ["base", "kernels", "tape", "ops", "config", "model", "run"]
MAX_HEADER = 200
EXTRA_HEADERS = {
    "core/kernels/fastmath.h": "static inline vector exp, tanh and log that kernels and ops inline",
    "core/ops/lstm-row.h": "static inline: one LSTM row's forward, inlined by lstm.c and lstm-seq.c",
    "core/kernels/bf16-amx.h": "the AMX tile code bf16.c and bf16-grads.c share (static inline, target attributes)",
}
GENERATED = {"plugins/metrics/rouge-exceptions.c"}

files = []
for top in ("core", "plugins"):
    for d, _, names in os.walk(os.path.join(src, top)):
        if "/." in d:
            continue
        for n in names:
            if n.endswith((".c", ".h")):
                rel = os.path.relpath(os.path.join(d, n), src)
                if rel not in GENERATED:
                    files.append(rel)
files.sort()
fails = []
seen_file, seen_func, seen_layers, seen_extra = set(), set(), set(), set()
inc_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
graph = {}
for rel in files:
    lines = open(os.path.join(src, rel), encoding="utf-8", errors="replace").read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) > MAX_FILE:
        if rel in FILE_EXCEPTIONS:
            seen_file.add(rel)
        else:
            fails.append(f"{rel}: {len(lines)} lines, more than {MAX_FILE}")
    sig, start = "", None
    for i, line in enumerate(lines, 1):
        if start is None and re.match(r"[A-Za-z_]", line) and "(" in line:
            sig = line
        if line.startswith("{") and start is None:
            start = i
        elif line.startswith("}") and start is not None:
            n = i - start + 1
            m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", sig) or re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", sig)
            name = m.group(1) if m else "?"
            if n > MAX_FUNC:
                if (rel, name) in FUNC_EXCEPTIONS:
                    seen_func.add((rel, name))
                else:
                    fails.append(f"{rel}:{start}: function {name} is {n} lines, more than {MAX_FUNC}")
            start = None
    # includes
    here = os.path.dirname(rel)
    deps = []
    for line in lines:
        m = inc_re.match(line)
        if not m:
            continue
        kind, name = m.groups()
        target = None
        if kind == '"':
            for base in (here, "core", "core/psm"):
                cand = os.path.normpath(os.path.join(base, name))
                if os.path.exists(os.path.join(src, cand)):
                    target = cand
                    break
        elif name.startswith("psm/"):
            target = os.path.normpath(os.path.join("core", name))
        if rel.startswith("plugins/"):
            if kind == "<" and not name.startswith("psm/") and target is None:
                continue   # a system header
            ok = target is not None and (target.startswith("core/psm/") or os.path.dirname(target) == here)
            if not ok:
                fails.append(f"{rel}: includes {kind}{name}{'>' if kind == '<' else kind}, not a public psm header nor one of its folder's")
        if rel.startswith("core/psm/") and target is not None and not target.startswith("core/psm/"):
            fails.append(f"{rel}: a public header includes the core-private {target}")
        if target is not None:
            deps.append(target)
    graph[rel] = deps
    # the layers
    parts = rel.split("/")
    if parts[0] == "core" and len(parts) == 2:
        fails.append(f"{rel}: a core file outside the layers' folders ({', '.join(LAYERS)})")
    if parts[0] == "core" and len(parts) >= 3 and parts[1] != "psm":
        layer = parts[1]
        if layer not in LAYERS:
            fails.append(f"{rel}: core/{layer}/ is not a layer ({', '.join(LAYERS)})")
            continue
        for t in deps:
            tl = t.split("/")
            if tl[0] == "core" and len(tl) >= 3 and tl[1] in LAYERS and LAYERS.index(tl[1]) > LAYERS.index(layer):
                fails.append(f"{rel}: layer {layer} includes {t} of the higher layer {tl[1]}")
        if rel.endswith(".h"):
            if rel == f"core/{layer}/{layer}-internal.h":
                seen_layers.add(layer)
                if len(lines) > MAX_HEADER:
                    fails.append(f"{rel}: {len(lines)} lines, more than {MAX_HEADER} for a layer's header")
            elif rel in EXTRA_HEADERS:
                seen_extra.add(rel)
            else:
                fails.append(f"{rel}: a second header in layer {layer} (its header is core/{layer}/{layer}-internal.h)")

for layer in LAYERS:
    if layer not in seen_layers:
        fails.append(f"core/{layer}/{layer}-internal.h: the layer's header is missing")
for rel in EXTRA_HEADERS:
    if rel not in seen_extra:
        fails.append(f"{rel}: listed as an extra header but not found: take it off the list")

for rel, why in FILE_EXCEPTIONS.items():
    if rel not in seen_file:
        fails.append(f"{rel}: listed as an exception to the {MAX_FILE}-line rule but no longer breaks it: take it off the list")
for key, why in FUNC_EXCEPTIONS.items():
    if key not in seen_func:
        fails.append(f"{key[0]}: function {key[1]} listed as an exception but no longer breaks the rule: take it off the list")

# circles in the include graph (depth-first search, the first circle found reported)
state, stack = {}, []
def visit(f):
    state[f] = 1
    stack.append(f)
    for g in graph.get(f, []):
        if state.get(g) == 1:
            fails.append("include circle: " + " -> ".join(stack[stack.index(g):] + [g]))
        elif g in graph and not state.get(g):
            visit(g)
    stack.pop()
    state[f] = 2
sys.setrecursionlimit(10000)
for f in sorted(graph):
    if not state.get(f):
        visit(f)

print(f"files {len(files)}, includes {sum(len(v) for v in graph.values())}, layers {len(LAYERS)}, "
      f"exceptions: {len(FILE_EXCEPTIONS)} files, {len(FUNC_EXCEPTIONS)} functions, {len(EXTRA_HEADERS)} extra headers")
for f in fails:
    print("FAIL " + f)
EOF
python3 "$tmp/check.py" "$src" > "$tmp/out"
sed -n 1p "$tmp/out" | sed 's/^/# /'
if [ ! -s "$tmp/out" ]; then bad "the layout check ran" /dev/null
elif grep -q '^FAIL' "$tmp/out"; then
  grep '^FAIL' "$tmp/out" | sed 's/^FAIL /# /'
  bad "sizes, includes, layers and the include graph keep the layout rules (see above)" /dev/null
else ok "every file and function within its size or listed with a reason; plugins include only public headers; no include circle; every layer includes only downward, through one header of at most 200 lines"; fi

# the check catches what it is for: a copy of the tree with a base file
# including the run layer's header, a core file outside the layers and a
# second header in a layer
mkdir -p "$tmp/tree" && cp -r "$src/core" "$src/plugins" "$tmp/tree/" &&
  sed -i '1i #include "run/run-internal.h"' "$tmp/tree/core/base/psm-mem.c" &&
  : > "$tmp/tree/core/psm-stray.c" && : > "$tmp/tree/core/tape/extra.h" &&
  python3 "$tmp/check.py" "$tmp/tree" > "$tmp/out2"
grep -q "core/base/psm-mem.c: layer base includes core/run/run-internal.h of the higher layer run" "$tmp/out2" &&
  grep -q "core/psm-stray.c: a core file outside the layers" "$tmp/out2" &&
  grep -q "core/tape/extra.h: a second header in layer tape" "$tmp/out2" \
  && ok "an upward include, a file outside the layers and a second header are each caught" \
  || bad "the layer rules catch an upward include, a stray file and a second header" "$tmp/out2"
finish
