#!/usr/bin/env python3
"""The read-again tables of RESULTS.md from bench/readagain-tables.sh's logs.

    bench/readagain-report.py [RUNS_DIR]      (default runs/readagain)

For each variant of pipelines/gigaword_readagain_ablations.txt: the update
of the tested checkpoint, its validation NLL, the training time, ROUGE-1/2/L
F1 on the Gigaword test (NAME.test.log, else the training log's test line)
and on the CNN/DailyMail validation split (NAME.valid.log). (Decoding time:
bench/readagain-decode.sh, on a machine doing nothing else.)"""
import os
import re
import sys

from runlogs import read   # bench/runlogs.py, beside this script

root = sys.argv[1] if len(sys.argv) > 1 else "runs/readagain"
here = os.path.dirname(os.path.abspath(__file__))
names = []
with open(os.path.join(here, "..", "pipelines", "gigaword_readagain_ablations.txt")) as f:
    for line in f:
        if line.strip() and not line.startswith("#"):
            names.append(line.split()[0])


def scores(text, split):
    m = re.search(r"^%s \(.*?\) step (\d+): loss ([\d.]+)\s+rouge1_f ([\d.]+)\s+rouge2_f ([\d.]+)\s+rougeL_f ([\d.]+)"
                  % split, text, re.M)
    return m.groups() if m else None


print("| variant | tested at | valid NLL | trained | test ROUGE-1/2/L F1 | valid ROUGE-1/2/L F1 |")
print("|---|---|---|---|---|---|")
for n in names:
    train = read(os.path.join(root, n + ".log"))
    test = read(os.path.join(root, n + ".test.log")) or train
    valid = read(os.path.join(root, n + ".valid.log"))
    t, v = scores(test, "test"), scores(valid, "valid")
    secs = re.search(r"trained \d+ steps in ([\d.]+) s", train)
    best = [float(x) for x in re.findall(r"valid step \d+: loss ([\d.]+)", train)]
    if not t:
        print(f"| {n} | (no test result) | | | | |")
        continue
    print(f"| {n} | {int(t[0]):,} | {min(best) if best else float('nan'):.3f} | "
          f"{float(secs.group(1)) / 60 if secs else float('nan'):.1f} min | "
          f"{float(t[2]):.2f} / {float(t[3]):.2f} / {float(t[4]):.2f} | "
          + (f"{float(v[2]):.2f} / {float(v[3]):.2f} / {float(v[4]):.2f}" if v else "") + " |")
