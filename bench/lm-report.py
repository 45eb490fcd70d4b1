#!/usr/bin/env python3
"""The tables of RESULTS.md's learning-rate grid from bench/lm-grid.sh's runs.

    python3 bench/lm-report.py [OUT]      (default runs/lm-grid)

For each run: the validation perplexity at every evaluation (once an epoch
for the side-by-side runs, every 600 updates for k1 = 1) with the seconds
of training it had taken, the test perplexity of the best checkpoint and,
for the sentinel, the mean gate on the test split; then the SGD probes'
mean gates."""
import json
import os
import re
import sys

from runlogs import read   # bench/runlogs.py, beside this script

out = sys.argv[1] if len(sys.argv) > 1 else "runs/lm-grid"


def curve(name):
    pts = []
    for line in read(os.path.join(out, name, "log.jsonl")).splitlines():
        r = json.loads(line)
        if r.get("split") == "valid":
            pts.append((r["step"], r["perplexity"], r["time"]))
    return pts


def number(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def fmt(x, f="%.1f"):
    return f % x if x is not None else "—"


names = sorted(n[:-4] for n in os.listdir(out) if n.endswith(".log") and not n.startswith("probe")
               and not n.endswith(".decode.log"))
print("| run | valid ppl at each evaluation (update: ppl @ seconds) | best valid | test ppl | mean gate (test) |")
print("|---|---|---|---|---|")
for n in names:
    pts = curve(n)
    if not pts:
        continue
    log = read(os.path.join(out, n + ".log"))
    test = number(r"test \(.*?perplexity ([0-9.]+)", log)
    gate = number(r"mean gate \(probability of the vocabulary softmax\) ([0-9.]+)",
                  read(os.path.join(out, n + ".decode.log")))
    cells = ", ".join("%d: %.1f @ %.0f" % p for p in pts)
    print("| %s | %s | %.1f | %s | %s |" % (n, cells, min(p[1] for p in pts), fmt(test), fmt(gate, "%.3f")))
print()
print("| SGD lr 5 probe | updates | valid ppl | mean gate (valid) |")
print("|---|---|---|---|")
for pl in ("true", "false"):
    for k in (29, 87):
        text = read(os.path.join(out, "probe_pl%s_%d.decode.log" % (pl, k)))
        print("| pointer_loss = %s | %d | %s | %s |" % (pl, k, fmt(number(r"perplexity ([0-9.]+)", text)),
              fmt(number(r"mean gate \(probability of the vocabulary softmax\) ([0-9.]+)", text), "%.4f")))
