#!/usr/bin/python3
"""See et al. 2017's pointer-generator with coverage in PyTorch: the reference
for bench/bench-see.c (same shapes, same equations as psm's bilstm, lstm_attn
and pointer_generator plugins; see BENCHMARKS.md).

  see_torch.py train SECONDS [B T TY V]   training steps on random batches
  see_torch.py decode FILE [N]            beam-4 decoding of N articles, 100 tokens

Training: embedding 128 (shared), one bidirectional LSTM layer of 256, the
final states reduced to the decoder's (h, c) by ReLU layers, an LSTM decoder
whose input is W[y_(t-1); h*_(t-1)], additive attention from [h_t; c_t] with
the coverage vector as an input, p_gen from [h*_t; s_t; x_t], the
vocabulary distribution softmax(V'(V[s_t; h*_t] + b) + b') projected for all
steps in one GEMM, the extended-vocabulary mixture (scatter of the
attention), loss -log P(w*) + coverage loss, Adagrad (0.15, accumulator
0.1), gradient clipping at 2.  Prints one line: ms a step, target tokens/s,
peak RSS. TORCH_AUTOCAST=bf16: training under torch.autocast('cpu',
torch.bfloat16), as bench/lm_torch.py (BENCHMARKS.md c).
"""
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

AUTOCAST = os.environ.get('TORCH_AUTOCAST', '') == 'bf16'
E, H = 128, 256


class See(nn.Module):
    def __init__(self, V):
        super().__init__()
        self.V = V
        self.emb = nn.Embedding(V, E)
        self.enc = nn.LSTM(E, H, batch_first=True, bidirectional=True)
        self.red_h = nn.Linear(2 * H, H)
        self.red_c = nn.Linear(2 * H, H)
        self.w_enc = nn.Linear(2 * H, 2 * H, bias=False)
        self.w_in = nn.Linear(E + 2 * H, E)
        self.cell = nn.LSTMCell(E, H)
        self.w_dec = nn.Linear(2 * H, 2 * H)
        self.v = nn.Parameter(torch.empty(2 * H).uniform_(-0.1, 0.1))
        self.w_c = nn.Parameter(torch.zeros(2 * H))
        self.w_ptr = nn.Linear(2 * H + H + E, 1)
        self.w_v = nn.Linear(H + 2 * H, H)
        self.w_o = nn.Linear(H, V)

    def encode(self, src):                       # src [B, T]
        ann, (h, c) = self.enc(self.emb(src))     # ann [B, T, 2H]
        h = F.relu(self.red_h(torch.cat([h[0], h[1]], -1)))
        c = F.relu(self.red_c(torch.cat([c[0], c[1]], -1)))
        return ann, self.w_enc(ann), h, c

    def step(self, ann, feat, mask, y, h, c, ctx, cov):
        """Batch-major, as See's code: ann, feat [B, T, 2H], mask, cov [B, T]."""
        x = self.w_in(torch.cat([self.emb(y), ctx], -1))
        h, c = self.cell(x, (h, c))
        q = self.w_dec(torch.cat([h, c], -1))
        e = torch.tanh(feat + q.unsqueeze(1) + cov.unsqueeze(-1) * self.w_c) @ self.v   # [B, T]
        e = e.masked_fill(mask == 0, -1e9)
        a = torch.softmax(e, 1)
        ctx = torch.bmm(a.unsqueeze(1), ann).squeeze(1)
        return x, h, c, ctx, a

    def loss(self, src, src_ext, mask, dec_in, tgt_ext, tmask, n_ext):
        ann, feat, h, c = self.encode(src)
        B, T = src.shape
        ctx = ann.new_zeros(B, 2 * H)
        cov = ann.new_zeros(B, T)
        hs, ctxs, xs, atts, covl = [], [], [], [], []
        for t in range(dec_in.shape[0]):
            x, h, c, ctx, a = self.step(ann, feat, mask, dec_in[t], h, c, ctx, cov)
            covl.append(torch.minimum(a, cov).sum(1))
            cov = cov + a
            hs.append(h); ctxs.append(ctx); xs.append(x); atts.append(a)
        Ty = len(hs)
        hs, ctxs, xs = torch.stack(hs), torch.stack(ctxs), torch.stack(xs)       # [Ty, B, .]
        p_gen = torch.sigmoid(self.w_ptr(torch.cat([ctxs, hs, xs], -1)))          # [Ty, B, 1]
        p_vocab = torch.softmax(self.w_o(self.w_v(torch.cat([hs, ctxs], -1))), -1)
        dist = torch.cat([p_gen * p_vocab, p_vocab.new_zeros(Ty, B, n_ext - self.V)], -1)
        att = torch.stack(atts)                                                   # [Ty, B, T]
        idx = src_ext.unsqueeze(0).expand(Ty, B, T)
        dist = dist.scatter_add(2, idx, (1 - p_gen) * att)
        p = dist.gather(2, tgt_ext.unsqueeze(-1)).squeeze(-1)
        nll = -torch.log(p + 1e-12)
        n = tmask.sum()
        return (nll * tmask).sum() / n + (torch.stack(covl) * tmask).sum() / n

    @torch.no_grad()
    def beam(self, src, src_ext, n_ext, beam=4, steps=100):
        """Beam search over one article (src [1, T]), exactly `steps` tokens."""
        ann, feat, h, c = self.encode(src)
        T = src.shape[1]
        ann, feat = ann.expand(beam, T, 2 * H), feat.expand(beam, T, 2 * H)
        mask = torch.ones(beam, T)
        h, c = h.expand(beam, H).contiguous(), c.expand(beam, H).contiguous()
        ctx = ann.new_zeros(beam, 2 * H)
        cov = ann.new_zeros(beam, T)
        y = torch.full((beam,), 2, dtype=torch.long)
        score = torch.full((beam,), -1e9)
        score[0] = 0
        idx = src_ext.expand(beam, T)
        out = []
        for _ in range(steps):
            x, h, c, ctx, a = self.step(ann, feat, mask, y, h, c, ctx, cov)
            cov = cov + a
            p_gen = torch.sigmoid(self.w_ptr(torch.cat([ctx, h, x], -1)))
            p_vocab = torch.softmax(self.w_o(self.w_v(torch.cat([h, ctx], -1))), -1)
            dist = torch.cat([p_gen * p_vocab, p_vocab.new_zeros(beam, n_ext - self.V)], -1)
            dist = dist.scatter_add(1, idx, (1 - p_gen) * a)
            tot = (score.unsqueeze(1) + torch.log(dist + 1e-12)).view(-1)
            score, best = tot.topk(beam)
            parent, word = best // n_ext, best % n_ext
            h, c, ctx, cov = h[parent], c[parent], ctx[parent], cov[parent]
            out = [o[parent] for o in out] + [word]
            y = torch.where(word < self.V, word, torch.full_like(word, 1))
        return torch.stack(out, 1)[0]


def main():
    torch.manual_seed(1)
    mode = sys.argv[1]
    if mode == 'train':
        secs = float(sys.argv[2])
        B, T, TY, V = (int(a) for a in (sys.argv[3:7] if len(sys.argv) > 6 else (16, 400, 100, 20000)))
        n_oov = 20
        m = See(V)
        opt = torch.optim.Adagrad(m.parameters(), lr=0.15, initial_accumulator_value=0.1)
        src_ext = torch.randint(4, V + n_oov, (B, T))
        src = torch.where(src_ext < V, src_ext, torch.ones_like(src_ext))
        mask = torch.ones(B, T)
        tgt_ext = torch.randint(4, V + n_oov, (TY, B))
        dec_in = torch.cat([torch.full((1, B), 2), tgt_ext[:-1]])
        dec_in = torch.where(dec_in < V, dec_in, torch.ones_like(dec_in))
        tmask = torch.ones(TY, B)
        steps, t0, warm = 0, None, 2
        while True:
            if steps == warm:
                t0 = time.perf_counter()
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=AUTOCAST):
                loss = m.loss(src, src_ext, mask, dec_in, tgt_ext, tmask, V + n_oov).float()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 2.0)
            opt.step()
            steps += 1
            if t0 is not None and time.perf_counter() - t0 >= secs and steps - warm >= 2:
                break
        dt = (time.perf_counter() - t0) / (steps - warm)
        print(f'torch train B={B} T={T} Ty={TY} V={V}{", autocast bf16" if AUTOCAST else ""}: {1e3 * dt:.1f} ms/step, '
              f'{B * TY / dt:.0f} target tokens/s, loss {loss.item():.3f}, '
              f'peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB '
              f'({steps - warm} timed steps, {torch.get_num_threads()} threads)')
    elif mode == 'decode':
        lines = open(sys.argv[2], encoding='utf-8').read().split('\n')
        lines = [l for l in lines if l.strip()]
        n = min(len(lines) - 1, int(sys.argv[3]) if len(sys.argv) > 3 else len(lines))
        V, n_oov = 20000, 20
        m = See(V).eval()
        # the articles' lengths (cut at 400 words as psm's cnndm task does);
        # the words themselves do not change the work
        arts = [torch.randint(4, V + n_oov, (1, min(len(l.split()), 400))) for l in lines[:n + 1]]
        m.beam(torch.where(arts[0] < V, arts[0], torch.ones_like(arts[0])), arts[0], V + n_oov)   # warm-up
        t0 = time.perf_counter()
        for a in arts[1:]:
            m.beam(torch.where(a < V, a, torch.ones_like(a)), a, V + n_oov)
        dt = time.perf_counter() - t0
        print(f'torch decode beam 4, 100 tokens, T<=400: {n / dt:.2f} articles/s, '
              f'peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB '
              f'({n} articles, {torch.get_num_threads()} threads)')
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    main()
