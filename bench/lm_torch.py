#!/usr/bin/python3
"""The word-level LSTM language model of Merity et al.'s medium setting in
PyTorch: the reference for bench/bench-lm.c (BENCHMARKS.md, section d).

  lm_torch.py train SECONDS [TRAIN_FILE]   SGD steps on the PTB training stream
  lm_torch.py eval TEST_FILE TRAIN_FILE    the whole test split, timed

Embedding 650, nn.LSTM of 2 layers x 650, locked (variational) dropout 0.5
on each layer's input and the output (one mask per stream and unit for the
segment, applied around nn.LSTM, which has no such option: the layers run
as two nn.LSTM calls), softmax over the 10,000 words, cross-entropy, batch
32 x BPTT 100, hidden state carried (detached) between segments, SGD lr 5,
gradient norm clipped to 1. No zoneout: nn.LSTM's fused kernel cannot do
it (psm's number without zoneout is the like-for-like one). Prints words/s
and peak RSS; eval prints the seconds for the test split at batch 32.
TORCH_AUTOCAST=bf16 runs the model under torch.autocast('cpu',
torch.bfloat16) (mixed precision: the products in bfloat16 through oneDNN,
on AMX where the CPU has it; the loss and the carried state in single
precision). psm trains in single precision only; BENCHMARKS.md d has both
PyTorch numbers.
"""
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

AUTOCAST = os.environ.get('TORCH_AUTOCAST', '') == 'bf16'
E = H = 650
L, B, BPTT, P = 2, 32, 100, 0.5


def read_ids(path, vocab, grow):
    ids = []
    for line in open(path, encoding='utf-8'):
        for w in line.split() + ['<eos>']:
            if w not in vocab:
                if not grow:
                    w = '<unk>'
                else:
                    vocab[w] = len(vocab)
            ids.append(vocab[w])
    return torch.tensor(ids, dtype=torch.long)


class LM(nn.Module):
    def __init__(self, V):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.ModuleList([nn.LSTM(E if l == 0 else H, H) for l in range(L)])
        self.out = nn.Linear(H, V)
        for p in self.parameters():
            nn.init.uniform_(p, -0.05, 0.05)

    @staticmethod
    def locked(x, p):
        if not torch.is_grad_enabled() or p == 0:
            return x
        m = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - p) / (1 - p)
        return x * m

    def forward(self, x, state):
        h = self.emb(x)
        new = []
        for l, rnn in enumerate(self.rnn):
            h, s = rnn(self.locked(h, P), state[l])
            new.append(s)
        return self.out(self.locked(h, P)), new


def batchify(ids, b):
    n = ids.size(0) // b
    return ids[:n * b].view(b, n).t().contiguous()   # [N, B]


def main():
    torch.manual_seed(1)
    mode = sys.argv[1]
    data = '../shared/data/ptb/'
    train_file = sys.argv[3] if mode == 'train' and len(sys.argv) > 3 else \
        (sys.argv[3] if mode == 'eval' else data + 'ptb.train.txt')
    vocab = {}
    train = read_ids(train_file, vocab, True)
    V = len(vocab)
    model = LM(V)
    zero = [(torch.zeros(1, B, H), torch.zeros(1, B, H)) for _ in range(L)]
    if mode == 'train':
        secs = float(sys.argv[2])
        stream = batchify(train, B)
        opt = torch.optim.SGD(model.parameters(), lr=5.0)
        state, i, steps, words, t0 = zero, 0, 0, 0, None
        while True:
            if steps == 2:
                t0, words = time.time(), 0
            if t0 is not None and steps > 3 and time.time() - t0 >= secs:
                break
            if i + BPTT + 1 > stream.size(0):
                i, state = 0, zero
            x, y = stream[i:i + BPTT], stream[i + 1:i + 1 + BPTT]
            state = [(h.detach(), c.detach()) for h, c in state]
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=AUTOCAST):
                logits, state = model(x, state)
                loss = F.cross_entropy(logits.view(-1, V).float(), y.reshape(-1))
            state = [(h.float(), c.float()) for h, c in state]
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            i += BPTT
            steps += 1
            words += y.numel()
        dt = time.time() - t0
        print(f'torch train {L}x{H}, V={V}{", autocast bf16" if AUTOCAST else ""}: {1e3 * dt / (steps - 2):.1f} ms/step, {words / dt:.0f} words/s, '
              f'loss {loss.item():.3f}, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB '
              f'({steps - 2} timed steps, {torch.get_num_threads()} threads)')
    else:
        test = read_ids(sys.argv[2], vocab, False)
        model.eval()
        t0 = time.time()
        with torch.no_grad():
            stream = batchify(test[:-1], B)
            tgt = batchify(test[1:], B)
            state, tot, n = zero, 0.0, 0
            for i in range(0, stream.size(0), BPTT):
                x, y = stream[i:i + BPTT], tgt[i:i + BPTT]
                logits, state = model(x, state)
                tot += F.cross_entropy(logits.view(-1, V), y.reshape(-1), reduction='sum').item()
                n += y.numel()
        dt = time.time() - t0
        print(f'torch eval {L}x{H}: PTB test ({n} words, batch {B}) in {dt:.2f} s, {n / dt:.0f} words/s, '
              f'peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB '
              f'({torch.get_num_threads()} threads)')


if __name__ == '__main__':
    main()
