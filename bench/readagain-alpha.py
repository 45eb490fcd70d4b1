#!/usr/bin/env python3
"""Mean read-again importance per word (Zeng et al. 2016, Figure 4).

Reads the decoder's per-token JSON lines (psm-run RUN.cfg --mode decode
--json writes DIR/decode.SPLIT.jsonl; a read-again encoder adds "source"
and "importance", the mean of alpha_i over its units per source token) and
prints the words seen at least MIN times, most and least weighted first.
    bench/readagain-alpha.py DIR/decode.test.jsonl [MIN] [N]
"""
import json
import sys


def main():
    path = sys.argv[1]
    least = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    total, count, tokens, lines = {}, {}, 0, 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "importance" not in rec:
                sys.exit(f"{path}: line {lines + 1} has no importance (not a read-again encoder?)")
            lines += 1
            for w, a in zip(rec["source"], rec["importance"]):
                total[w] = total.get(w, 0.0) + a
                count[w] = count.get(w, 0) + 1
                tokens += 1
    mean = {w: total[w] / count[w] for w in total if count[w] >= least}
    overall = sum(total.values()) / max(tokens, 1)
    ranked = sorted(mean, key=mean.get, reverse=True)
    print(f"# {path}: {lines} articles, {tokens} source tokens, mean importance {overall:.4f}; "
          f"{len(ranked)} words seen >= {least} times")
    print(f"{'most weighted':<24}{'mean':>8}{'n':>7}    {'least weighted':<24}{'mean':>8}{'n':>7}")
    for hi, lo in zip(ranked[:n], reversed(ranked[-n:])):
        print(f"{hi:<24}{mean[hi]:>8.4f}{count[hi]:>7}    {lo:<24}{mean[lo]:>8.4f}{count[lo]:>7}")


if __name__ == "__main__":
    main()
