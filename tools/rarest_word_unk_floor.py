#!/usr/bin/python3
"""Error of a pointer that picks one of the <unk> positions at random, on
rarest-word sequences whose target is among the U rarest words read as <unk>
(task.unk_words = U): the part of the error no model can avoid, since two
different rare words in one sequence look the same to the encoder.
Draws sequences as plugins/tasks/rarest_word.c does.
usage: /usr/bin/python3 tools/rarest_word_unk_floor.py [V L U p N seed]"""
import sys
import numpy as np

V, L, U, p, N, seed = 600, 7, 60, 0.002, 400000, 0
if len(sys.argv) > 1:
    V, L, U, p, N, seed = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                           float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
w = (1 - p) ** np.arange(V)
seqs = np.random.default_rng(seed).choice(V, size=(N, L), p=w / w.sum())
rare = seqs >= V - U
has = rare.any(axis=1)
# P(wrong) for a uniform pick among the <unk> positions: the share of them
# that do not hold the rarest word
masked = np.where(rare, seqs, -1)
best = masked.max(axis=1, keepdims=True)
right = ((masked == best) & rare).sum(axis=1) / np.maximum(rare.sum(axis=1), 1)
n = has.sum()
print("sequences %d; target among the rarest %d: %.2f %%" % (N, U, 100.0 * n / N))
print("random pick among <unk> positions: wrong on %.2f %% of those targets, %.2f %% of all"
      % (100.0 * (1 - right[has]).mean(), 100.0 * (1 - right[has]).sum() / N))
