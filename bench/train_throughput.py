#!/usr/bin/python3
"""PyTorch eager baseline for bench/train_throughput: the same GPT-2 (pre-LN, fused qkv,
tanh GELU, tied head, GPT-2 init), the same AdamW (decay on matrices only), the same batches
(SplitMix64 window sampling of agent/executor/dataset.cc) and the same thread count."""
import argparse, json, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F

M64 = (1 << 64) - 1

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)

def offsets(seed, step, batch, train_tokens, window):
    rng = train_tokens - window + 1
    base = splitmix64(splitmix64(seed) ^ step)
    return [splitmix64(base ^ i) % rng for i in range(batch)]

class Block(nn.Module):
    def __init__(self, c, h, t, sdpa=False):
        super().__init__()
        self.h, self.sdpa = h, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.register_buffer("mask", torch.full((t, t), float("-inf")).triu(1).view(1, 1, t, t))

    def forward(self, x):
        B, T, C = x.shape
        D = C // self.h
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, D).transpose(1, 2)
        k = k.view(B, T, self.h, D).transpose(1, 2)
        v = v.view(B, T, self.h, D).transpose(1, 2)
        if self.sdpa:  # one fused kernel (flash or memory-efficient on a GPU): no T x T scores kept
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)).mul_(1.0 / math.sqrt(D))
            att = torch.softmax(att + self.mask[:, :, :T, :T], -1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(self, v, t, c, h, n, sdpa=False):
        super().__init__()
        self.wte = nn.Parameter(torch.empty(v, c).normal_(0, 0.02))
        self.wpe = nn.Parameter(torch.empty(t, c).normal_(0, 0.02))
        self.blocks = nn.ModuleList([Block(c, h, t, sdpa) for _ in range(n)])
        for b in self.blocks:
            for lin in (b.qkv, b.proj, b.fc, b.fc_proj):
                std = 0.02 / math.sqrt(2 * n) if lin in (b.proj, b.fc_proj) else 0.02
                nn.init.normal_(lin.weight, 0, std)
                nn.init.zeros_(lin.bias)
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx):
        x = F.embedding(idx, self.wte) + self.wpe[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return torch.matmul(self.ln_f(x), self.wte.t())

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", required=True)
    for name, default in [("layers", 4), ("embd", 128), ("heads", 4), ("ctx", 128), ("vocab", 256), ("batch", 8),
                          ("steps", 200), ("warmup", 3), ("threads", 2), ("seed", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: torch.autocast(device, dtype=torch.bfloat16) around forward and loss")
    p.add_argument("--device", default="cpu", help="cpu, or cuda[:N] (bench/spill.sh --gpu)")
    p.add_argument("--attention", choices=["math", "sdpa"], default="math",
                   help="sdpa: F.scaled_dot_product_attention (torch 2.0+; Hydra's CUDA build fuses "
                        "attention so); math: the scores materialised, as Hydra's Debian build")
    p.add_argument("--adamw", choices=["default", "fused"], default="default",
                   help="fused: torch.optim.AdamW(fused=True), one kernel for every parameter (torch "
                        "2.0+ on a GPU); default: the version's default (foreach on a GPU)")
    p.add_argument("--profile-trace", default="",
                   help="after the timed steps, record --profile-steps more steps' GPU kernels to this "
                        "Chrome trace (torch.profiler; bench/trace_summary.py sums it)")
    p.add_argument("--profile-steps", type=int, default=2)
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data = open(a.corpus, "rb").read()
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)
    train_tokens = int(len(data) * (1 - 0.05))
    model = GPT(a.vocab, a.ctx, a.embd, a.heads, a.layers, a.attention == "sdpa").to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = {"fused": True} if a.adamw == "fused" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-4, **fused)
    window = a.ctx + 1

    def step(s):
        offs = offsets(a.seed, s, a.batch, train_tokens, window)
        batch = torch.stack([tokens[o:o + window] for o in offs]).to(dev)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()  # the version's default: zeroed in torch 1.x, freed from 2.0 on
        return loss.item()

    s = 0
    for _ in range(a.warmup):
        loss = step(s); s += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step(s); s += 1
    dt = time.perf_counter() - t0  # loss.item() waited for the device
    out = {"impl": "pytorch-eager", "precision": a.precision, "device": a.device, "attention": a.attention, "adamw": a.adamw,
           "tokens_per_second": a.steps * a.batch * a.ctx / dt, "seconds": dt, "final_loss": loss}
    if dev.type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    if a.profile_trace:  # after the timing, which it leaves as it is
        acts = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(a.profile_steps):
                step(s); s += 1
        prof.export_chrome_trace(a.profile_trace)
    print(json.dumps(out))

if __name__ == "__main__":
    main()
