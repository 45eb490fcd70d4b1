#!/usr/bin/python3
"""PyTorch side of bench-gru: nn.GRU(H, H) forward over [T, B, H],
loss = sum(out * R), backward, SGD step. usage: gru_torch.py B H [T] [seconds]"""
import sys, time
import torch

B, H = int(sys.argv[1]), int(sys.argv[2])
T = int(sys.argv[3]) if len(sys.argv) > 3 else 35
min_time = float(sys.argv[4]) if len(sys.argv) > 4 else 3.0
torch.manual_seed(1)
gru = torch.nn.GRU(H, H)
opt = torch.optim.SGD(gru.parameters(), lr=1e-4)
x = torch.randn(T, B, H)
r = torch.randn(T, B, H)

def step():
    opt.zero_grad(set_to_none=True)
    out, _ = gru(x)
    loss = (out * r).sum()
    loss.backward()
    opt.step()

for _ in range(3):
    step()
n, t0 = 0, time.perf_counter()
while True:
    step()
    n += 1
    t = time.perf_counter() - t0
    if t >= min_time:
        break
print("torch B=%d H=%d T=%d: %.3f ms/step (%d steps; torch %s, %d threads)"
      % (B, H, T, 1e3 * t / n, n, torch.__version__, torch.get_num_threads()))
