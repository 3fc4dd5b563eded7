#!/usr/bin/env python3
"""Record an allocation trace from a PyTorch workload on a GPU, in devrt's trace format.

Runs one of a few model workloads with random weights (no data or downloads needed), with
PyTorch's memory history recording on, then converts the snapshot with snapshot_to_trace.py.
These are workloads that devrt's layouts were not tuned on: their traces check that a layout's
figures hold beyond the traces it was designed with.

    python3 tools/replay/record_torch_trace.py WORKLOAD -o WORKLOAD.trace.gz [--seed N]

Workloads:
  cnn_train     a ResNet-style convolutional network (bottleneck blocks, batch norm), SGD with
                momentum, fp32, 20 steps with batch 8-64 and images of 96-224 pixels
  bert_serve    a BERT-style encoder (12 layers, hidden 768), inference under no_grad with
                batch 1-32 and sequences of 16-512 tokens, 60 requests, fp16
  unet_train    a UNet-style encoder-decoder with skip connections, AdamW, bf16 autocast, 20 steps
                with batch 2-16 and images of 64-256 pixels
  moe_train     a decoder with mixture-of-experts feed-forward layers (8 experts, top-2 routing:
                tokens gathered per expert, so sizes vary per step), AdamW, bf16 autocast, 20 steps
"""

import argparse
import os
import pickle
import random
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshot_to_trace  # noqa: E402


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.b1 = nn.BatchNorm2d(mid)
        self.c2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(mid)
        self.c3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.b3 = nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


def resnet():
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for b in range(blocks):
            layers.append(Bottleneck(cin, mid, mid * 4, stride if b == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def cnn_train(rng, dev):
    model = resnet().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(20):
        batch = rng.choice([8, 16, 32, 64])
        side = rng.choice([96, 128, 160, 192, 224])
        x = torch.randn(batch, 3, side, side, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def bert_serve(rng, dev):
    layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, dtype=torch.float16, device=dev)
    model = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval()
    emb = nn.Embedding(30522, 768, dtype=torch.float16, device=dev)
    with torch.no_grad():
        for _ in range(60):
            batch = rng.randint(1, 32)
            seq = rng.choice([16, 32, 64, 128, 256, 384, 512])
            ids = torch.randint(0, 30522, (batch, seq), device=dev)
            out = model(emb(ids))
            out.float().mean().item()


class UNet(nn.Module):
    def __init__(self, ch=(64, 128, 256, 512)):
        super().__init__()
        self.down = nn.ModuleList()
        self.up = nn.ModuleList()
        cin = 3
        for c in ch:
            self.down.append(nn.Sequential(nn.Conv2d(cin, c, 3, 1, 1), nn.GroupNorm(8, c), nn.SiLU(),
                                           nn.Conv2d(c, c, 3, 1, 1), nn.GroupNorm(8, c), nn.SiLU()))
            cin = c
        for c in reversed(ch[:-1]):
            self.up.append(nn.ModuleList([nn.ConvTranspose2d(cin, c, 2, 2),
                                          nn.Sequential(nn.Conv2d(2 * c, c, 3, 1, 1), nn.GroupNorm(8, c), nn.SiLU())]))
            cin = c
        self.out = nn.Conv2d(cin, 3, 1)

    def forward(self, x):
        skips = []
        for i, d in enumerate(self.down):
            x = d(x)
            if i + 1 < len(self.down):
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for (upconv, conv), s in zip(self.up, reversed(skips)):
            x = conv(torch.cat([upconv(x), s], dim=1))
        return self.out(x)


def unet_train(rng, dev):
    model = UNet().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(20):
        batch = rng.choice([2, 4, 8, 16])
        side = rng.choice([64, 96, 128, 192, 256])
        x = torch.randn(batch, 3, side, side, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


class MoE(nn.Module):
    def __init__(self, d, experts=8, hidden=2048):
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.w1 = nn.ModuleList(nn.Linear(d, hidden) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(hidden, d) for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(flat), dim=-1), 2, dim=-1)
        out = torch.zeros_like(flat)
        for e in range(len(self.w1)):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            h = self.w2[e](F.gelu(self.w1[e](flat[rows])))
            out.index_add_(0, rows, h * weights[rows, slot].unsqueeze(-1))
        return out.reshape_as(x)


class MoEBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.n1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.n2 = nn.LayerNorm(d)
        self.moe = MoE(d)

    def forward(self, x):
        h = self.n1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], device=x.device, dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.moe(self.n2(x))


def moe_train(rng, dev):
    d = 512
    emb = nn.Embedding(32000, d).to(dev)
    blocks = nn.Sequential(*[MoEBlock(d, 8) for _ in range(6)]).to(dev)
    head = nn.Linear(d, 32000).to(dev)
    params = list(emb.parameters()) + list(blocks.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    for _ in range(20):
        batch = rng.choice([2, 4, 8, 16])
        seq = rng.choice([128, 256, 512, 1024])
        ids = torch.randint(0, 32000, (batch, seq), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = head(blocks(emb(ids)))
            loss = F.cross_entropy(logits.float().view(-1, 32000), ids.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


WORKLOADS = {"cnn_train": cnn_train, "bert_serve": bert_serve, "unet_train": unet_train, "moe_train": moe_train}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("-o", "--output", required=True, help="trace file to write (.trace.gz)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("record_torch_trace: no CUDA device", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    dev = torch.device("cuda", 0)
    torch.cuda.memory._record_memory_history(max_entries=5_000_000)
    WORKLOADS[args.workload](rng, dev)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
        pickle.dump(snap, f)
        path = f.name
    try:
        return snapshot_to_trace.main([path, "-o", args.output, "--trust"])
    finally:
        os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
