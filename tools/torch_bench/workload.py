"""One torch_bench workload under one allocator, in this process; writes a JSON result.

    PYTHONPATH=python python3 tools/torch_bench/workload.py --workload llama_gen --allocator devrt \\
        --lib build/release/runtime/libdevrt_c.so --out /tmp/llama_gen.devrt.json

Allocators: ``default`` (PyTorch's caching allocator), ``expandable`` (the same with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, which this script sets when it is not set
already), ``devrt`` (``devrt.torch.install()`` before the first CUDA allocation).

Workloads: llama_gen, gpt2_train, bert_infer (transformers models built from configs with random
weights; ``--impl plain`` uses plain torch.nn equivalents instead), side_stream (tensors handed
between streams with record_stream, checked exactly). run_all.py runs each in a fresh process.

Exit status: 0 ok, 1 a wrong result, 2 could not run, 3 (``--impl auto`` only) the transformers path
is unusable here, so run again with ``--impl plain``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common as common  # noqa: E402

SEED = 20261201

# ---------------------------------------------------------------------------------------------
# Workload sizes (plain data, so that the self-test can check them without torch).


def llama_config(small: bool) -> dict:
    if small:
        return dict(layers=2, hidden=1024, heads=8, intermediate=2816, vocab=32000, steps=8,
                    requests=[(1, 32), (4, 128), (8, 256), (2, 64)], warmup=[(2, 48)])
    return dict(layers=8, hidden=2048, heads=16, intermediate=5632, vocab=32000, steps=32,
                requests=[(1, 32), (4, 128), (8, 512), (2, 96), (8, 256), (1, 512), (4, 384), (2, 48),
                          (8, 64), (4, 512), (1, 200), (8, 448)],
                warmup=[(2, 64)])


def gpt2_config(small: bool) -> dict:
    import random

    rng = random.Random(SEED)
    if small:
        shapes = [(rng.choice([2, 4, 8]), rng.choice([128, 256, 512])) for _ in range(8)]
        return dict(layers=4, hidden=768, heads=12, vocab=50257, positions=1024, warmup=[(2, 128)], shapes=shapes)
    shapes = [(rng.choice([4, 8, 12, 16]), rng.choice([128, 256, 512, 1024])) for _ in range(30)]
    return dict(layers=12, hidden=768, heads=12, vocab=50257, positions=1024, warmup=[(4, 128), (4, 1024)],
                shapes=shapes)


def bert_config(small: bool) -> dict:
    import random

    rng = random.Random(SEED + 1)
    if small:
        shapes = [(rng.choice([1, 2, 4, 8, 16]), rng.choice([16, 64, 128, 256])) for _ in range(12)]
        return dict(layers=4, hidden=768, heads=12, intermediate=3072, vocab=30522, positions=512,
                    warmup=[(4, 64)], shapes=shapes)
    shapes = [(rng.choice([1, 2, 4, 8, 16, 32, 64]), rng.choice([16, 32, 64, 128, 256, 384, 512]))
              for _ in range(40)]
    return dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, positions=512,
                warmup=[(8, 128)], shapes=shapes)


def side_stream_config(small: bool) -> dict:
    import random

    rng = random.Random(SEED + 2)
    iters = 16 if small else 96
    sizes = [rng.choice([1 << 14, 1 << 16, 3 << 16, 1 << 18, 5 << 18, 1 << 20, 3 << 20, 1 << 22])
             for _ in range(iters)]
    return dict(iters=iters, sizes=sizes, matmul=4096 if small else 8192, slow_matmuls=2)


CONFIGS = {"llama_gen": llama_config, "gpt2_train": gpt2_config, "bert_infer": bert_config,
           "side_stream": side_stream_config}

# ---------------------------------------------------------------------------------------------
# Allocator setup and memory figures.

torch = None  # imported in main(), after the allocator environment is set


def import_torch(allocator: str, lib_path: str | None):
    """Imports torch with the allocator in place; devrt is installed before anything touches CUDA."""
    global torch
    if os.environ.get("PYTORCH_ALLOC_CONF"):
        common.fail(f"PYTORCH_ALLOC_CONF={os.environ['PYTORCH_ALLOC_CONF']!r} is set; unset it (run_all.py does): "
                    "this script sets PYTORCH_CUDA_ALLOC_CONF itself for allocator 'expandable'")
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if allocator == "expandable":
        if conf is None:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        elif "expandable_segments:True" not in conf.replace(" ", ""):
            common.fail(f"allocator 'expandable' but PYTORCH_CUDA_ALLOC_CONF={conf!r} lacks expandable_segments:True")
    elif os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        common.fail(f"PYTORCH_CUDA_ALLOC_CONF={os.environ['PYTORCH_CUDA_ALLOC_CONF']!r} is set, but allocator "
                    f"{allocator!r} wants PyTorch's default settings; unset it (run_all.py does)")
    try:
        import torch as t  # noqa: PLC0415
    except ImportError as e:
        common.fail(f"PyTorch is not installed for {sys.executable} ({e}); these workloads need a GPU machine "
                    "with torch")
    torch = t
    if allocator == "devrt":
        common.prepare_devrt_import(lib_path)
        try:
            import devrt  # noqa: PLC0415
            import devrt.torch  # noqa: PLC0415
        except ImportError as e:
            common.fail(f"cannot import the devrt package from {common.PYTHON_DIR} ({e}); run with PYTHONPATH=python")
        try:
            devrt.torch.install()
        except Exception as e:  # noqa: BLE001
            common.fail(f"devrt.torch.install() failed with {lib_path}: {type(e).__name__}: {e}"
                        + common.load_hint(e))
    if not torch.cuda.is_available():
        common.fail("torch.cuda.is_available() is False: no CUDA device here")
    return torch


def empty_cache(allocator: str) -> None:
    if allocator == "devrt":
        import devrt.torch  # noqa: PLC0415

        devrt.torch.empty_cache()
    else:
        torch.cuda.empty_cache()


def reset_peaks(allocator: str) -> None:
    if allocator == "devrt":
        import devrt.torch  # noqa: PLC0415

        devrt.torch.reset_peak_memory_stats()
    else:
        torch.cuda.reset_peak_memory_stats()


def memory_figures(allocator: str) -> dict:
    """Peak reserved and peak live bytes since the last reset_peaks. Under devrt the figures come
    from devrt.torch.memory_stats(): PyTorch's own statistics do not work with a pluggable allocator.
    "live" is the bytes asked for (PyTorch: requested_bytes, devrt: in_use_bytes), both unrounded."""
    if allocator == "devrt":
        import devrt.torch  # noqa: PLC0415

        s = devrt.torch.memory_stats()
        return {"peak_reserved_bytes": s["reserved_bytes.all.peak"], "peak_live_bytes": s["allocated_bytes.all.peak"],
                "reserved_bytes_end": s["reserved_bytes.all.current"], "allocations": s["allocation.all.allocated"],
                "num_ooms": s["num_ooms"], "num_alloc_retries": s["num_alloc_retries"],
                "num_device_alloc": s["num_device_alloc"], "num_device_free": s["num_device_free"]}
    s = torch.cuda.memory_stats()
    return {"peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            "peak_live_bytes": s.get("requested_bytes.all.peak", torch.cuda.max_memory_allocated()),
            "peak_allocated_rounded_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes_end": torch.cuda.memory_reserved(), "allocations": s.get("allocation.all.allocated"),
            "num_ooms": s.get("num_ooms"), "num_alloc_retries": s.get("num_alloc_retries"),
            "num_device_alloc": s.get("num_device_alloc"), "num_device_free": s.get("num_device_free")}


ALLOCATOR = None  # set by main()


def settle() -> None:
    """After a model is built: frees what building left cached and resets the peaks, so that the
    peaks cover warm-up and measured part with the model's weights resident."""
    torch.cuda.synchronize()
    empty_cache(ALLOCATOR)
    reset_peaks(ALLOCATOR)


API_ERRORS = (TypeError, AttributeError, ValueError, KeyError, NotImplementedError, ImportError)


def api_call(what, fn, *args, **kwargs):
    """Calls into transformers; an error that says its API differs here becomes TransformersUnusable
    (out of memory and CUDA errors pass through: they are results, not API trouble)."""
    try:
        return fn(*args, **kwargs)
    except API_ERRORS as e:
        raise TransformersUnusable(f"{what} failed: {type(e).__name__}: {e}") from e


def seed_all() -> None:
    import random

    random.seed(SEED)
    torch.manual_seed(SEED)  # seeds every CUDA device too


def cpu_gen(offset: int = 0):
    g = torch.Generator(device="cpu")
    g.manual_seed(SEED + offset)
    return g


def rand_tokens(g, vocab: int, *shape):
    return torch.randint(0, vocab, shape, generator=g, dtype=torch.long)


def build_on_device(make, dev, dtype):
    """Builds a module directly on the GPU in ``dtype`` (no fp32 copy on the device first), with a
    fallback for PyTorch builds that refuse a non-fp32 default dtype."""
    prev = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        set_ok = True
    except (TypeError, RuntimeError):
        set_ok = False
    try:
        with torch.device(dev):
            model = make()
    finally:
        torch.set_default_dtype(prev)
    if not set_ok:
        model = model.to(dtype)
    return model.to(device=dev, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Plain torch.nn models (used with --impl plain, or when transformers is not usable).


def plain_modules():
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return xf.to(x.dtype) * self.weight

    def rope(x, start):  # x: [B, H, T, D]
        d = x.shape[-1]
        half = d // 2
        inv = 1.0 / (10000.0 ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
        pos = torch.arange(start, start + x.shape[2], device=x.device, dtype=torch.float32)
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    class LlamaLayer(nn.Module):
        def __init__(self, c):
            super().__init__()
            h = c["hidden"]
            self.heads = c["heads"]
            self.n1, self.n2 = RMSNorm(h), RMSNorm(h)
            self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
            self.gate = nn.Linear(h, c["intermediate"], bias=False)
            self.up = nn.Linear(h, c["intermediate"], bias=False)
            self.down = nn.Linear(c["intermediate"], h, bias=False)

        def forward(self, x, cache):
            b, t, h = x.shape
            y = self.n1(x)
            q, k, v = (m(y).view(b, t, self.heads, h // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
            start = 0 if cache is None else cache[0].shape[2]
            q, k = rope(q, start), rope(k, start)
            if cache is not None:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=(t > 1 and start == 0))
            x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
            y = self.n2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y)), (k, v)

    class PlainLlama(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.embed = nn.Embedding(c["vocab"], c["hidden"])
            self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c["layers"]))
            self.norm = RMSNorm(c["hidden"])
            self.head = nn.Linear(c["hidden"], c["vocab"], bias=False)

        def forward(self, ids, past=None):
            x = self.embed(ids)
            new = []
            for i, layer in enumerate(self.layers):
                x, kv = layer(x, None if past is None else past[i])
                new.append(kv)
            return self.head(self.norm(x)), new

    class GPTBlock(nn.Module):
        def __init__(self, c):
            super().__init__()
            h = c["hidden"]
            self.heads = c["heads"]
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)
            self.fc = nn.Linear(h, 4 * h)
            self.out = nn.Linear(4 * h, h)

        def forward(self, x):
            b, t, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
            q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class PlainGPT2(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.wte = nn.Embedding(c["vocab"], c["hidden"])
            self.wpe = nn.Embedding(c["positions"], c["hidden"])
            self.blocks = nn.ModuleList(GPTBlock(c) for _ in range(c["layers"]))
            self.ln_f = nn.LayerNorm(c["hidden"])

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(pos)[None]
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, as GPT-2's
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    class PlainBert(nn.Module):
        def __init__(self, c):
            super().__init__()
            h = c["hidden"]
            self.word = nn.Embedding(c["vocab"], h)
            self.pos = nn.Embedding(c["positions"], h)
            self.ln = nn.LayerNorm(h)
            layer = nn.TransformerEncoderLayer(h, c["heads"], c["intermediate"], dropout=0.0, activation="gelu",
                                               batch_first=True)
            self.enc = nn.TransformerEncoder(layer, c["layers"], enable_nested_tensor=False)
            self.pool = nn.Linear(h, h)

        def forward(self, ids, mask):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.ln(self.word(ids) + self.pos(pos)[None])
            x = self.enc(x, src_key_padding_mask=(mask == 0))
            return x, torch.tanh(self.pool(x[:, 0]))

    return PlainLlama, PlainGPT2, PlainBert


class TransformersUnusable(Exception):
    """The transformers path failed here (missing package or an API that differs); --impl plain runs."""


def import_transformers():
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise TransformersUnusable(f"import transformers failed: {e}") from e
    return transformers


# ---------------------------------------------------------------------------------------------
# Workloads. Each returns (outputs, checks, info) and times its measured part itself.


SNAPSHOT = None  # --snapshot: where to write devrt's memory snapshot at the end of the measured part


def snapshot_here() -> None:
    """With --snapshot (allocator devrt): writes devrt.torch's memory snapshot (PyTorch's format,
    for torch.cuda._memory_viz) and, beside it as PATH.stats.json, devrt's statistics of the same
    moment, while the model and its tensors are still alive."""
    if SNAPSHOT is None or ALLOCATOR != "devrt":
        return
    import devrt  # noqa: PLC0415
    import devrt.torch  # noqa: PLC0415

    torch.cuda.synchronize()
    devrt.torch.dump_snapshot(SNAPSHOT)
    with open(SNAPSHOT + ".stats.json", "w") as f:
        json.dump(devrt.stats(0), f, indent=1)


class Timer:
    def __init__(self):
        self.wall_s = None
        self.warmup_s = None


def run_llama(c, dev, impl, result, timer):
    dtype = torch.bfloat16
    if impl == "transformers":
        tf = import_transformers()
        cfg = api_call("transformers.LlamaConfig(...)", tf.LlamaConfig, vocab_size=c["vocab"],
                       hidden_size=c["hidden"], intermediate_size=c["intermediate"], num_hidden_layers=c["layers"],
                       num_attention_heads=c["heads"], num_key_value_heads=c["heads"], max_position_embeddings=2048,
                       use_cache=True)
        model = api_call("LlamaForCausalLM(config)", build_on_device, lambda: tf.LlamaForCausalLM(cfg), dev, dtype)
        model.eval()

        def forward(ids, past):
            what = "LlamaForCausalLM prefill" if past is None else "LlamaForCausalLM decode step with past_key_values"
            out = api_call(what, model, input_ids=ids, past_key_values=past, use_cache=True)
            if out.past_key_values is None:
                raise TransformersUnusable("LlamaForCausalLM returned no past_key_values with use_cache=True")
            return out.logits[:, -1, :], out.past_key_values
    else:
        PlainLlama, _, _ = plain_modules()
        model = build_on_device(lambda: PlainLlama(c), dev, dtype).eval()

        def forward(ids, past):
            logits, new = model(ids, past)
            return logits[:, -1, :], new
    settle()

    g = cpu_gen(10)
    vocab, steps = c["vocab"], c["steps"]

    def request(batch, prompt_len):
        # The tokens fed at each decode step are drawn in advance (not the greedy choice), so every
        # allocator sees the same inputs even if two logits tie; the logits of every step are compared.
        prompt = rand_tokens(g, vocab, batch, prompt_len).to(dev)
        feed = rand_tokens(g, vocab, batch, steps).to(dev)
        samples = []
        past = None
        stride = max(1, vocab // 32)
        with torch.inference_mode():
            logits, past = forward(prompt, past)
            for step in range(steps + 1):
                lf = logits.float()
                samples.append(torch.cat([lf[0, ::stride][:32], lf[-1, ::stride][:32], lf.abs().mean(-1)[[0, -1]]]))
                if step == steps:
                    break
                logits, past = forward(feed[:, step:step + 1], past)
        del past, logits
        return torch.stack(samples).cpu()

    t0 = time.perf_counter()
    for b, p in c["warmup"]:
        request(b, p)
    torch.cuda.synchronize()
    timer.warmup_s = time.perf_counter() - t0

    per_request = []
    t0 = time.perf_counter()
    for b, p in c["requests"]:
        per_request.append(request(b, p))
    torch.cuda.synchronize()
    timer.wall_s = time.perf_counter() - t0
    snapshot_here()

    outputs = []
    for r, s in enumerate(per_request):
        for step in range(s.shape[0]):
            outputs.append(common.group(f"request{r}.step{step}.logits", s[step].tolist(), "maxabs_rel", 1e-2))
    finite = all(bool(torch.isfinite(s).all()) for s in per_request)
    checks = {"finite_logits": finite}
    info = {"requests": len(c["requests"]), "decode_steps": steps,
            "tokens": sum(b * (p + steps) for b, p in c["requests"])}
    return outputs, checks, info, finite


def run_gpt2(c, dev, impl, result, timer):
    if impl == "transformers":
        tf = import_transformers()
        cfg = api_call("transformers.GPT2Config(...)", tf.GPT2Config, vocab_size=c["vocab"],
                       n_positions=c["positions"], n_embd=c["hidden"], n_layer=c["layers"], n_head=c["heads"],
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        model = api_call("GPT2LMHeadModel(config)", build_on_device, lambda: tf.GPT2LMHeadModel(cfg), dev,
                         torch.float32)
        model.train()

        def loss_of(ids):
            out = api_call("GPT2LMHeadModel(input_ids, labels)", model, input_ids=ids, labels=ids, use_cache=False)
            if getattr(out, "loss", None) is None:
                raise TransformersUnusable("GPT2LMHeadModel(labels=...) returned no loss")
            return out.loss
    else:
        _, PlainGPT2, _ = plain_modules()
        model = build_on_device(lambda: PlainGPT2(c), dev, torch.float32).train()

        def loss_of(ids):
            return model(ids)
    settle()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    g = cpu_gen(20)

    def step(batch, seq):
        ids = rand_tokens(g, c["vocab"], batch, seq).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float()

    t0 = time.perf_counter()
    for b, s in c["warmup"]:
        step(b, s)
    torch.cuda.synchronize()
    timer.warmup_s = time.perf_counter() - t0

    losses = []
    t0 = time.perf_counter()
    for b, s in c["shapes"]:
        losses.append(step(b, s))
    torch.cuda.synchronize()
    timer.wall_s = time.perf_counter() - t0
    snapshot_here()

    losses = torch.stack(losses).cpu().tolist()
    with torch.no_grad():
        norms = [float(p.float().norm()) for p in list(model.parameters())[:8]]
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    outputs = [common.group("loss", losses, "rel", 1e-3), common.group("param_norms", norms, "rel", 1e-3)]
    info = {"steps": len(c["shapes"]), "tokens": sum(b * s for b, s in c["shapes"]), "first_loss": losses[0],
            "last_loss": losses[-1]}
    return outputs, {"finite_losses": finite}, info, finite


def run_bert(c, dev, impl, result, timer):
    if impl == "transformers":
        tf = import_transformers()
        cfg = api_call("transformers.BertConfig(...)", tf.BertConfig, vocab_size=c["vocab"],
                       hidden_size=c["hidden"], num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                       intermediate_size=c["intermediate"], max_position_embeddings=c["positions"])
        model = api_call("BertModel(config)", build_on_device, lambda: tf.BertModel(cfg), dev, torch.float32)
        model.eval()

        def forward(ids, mask):
            out = api_call("BertModel(input_ids, attention_mask)", model, input_ids=ids, attention_mask=mask)
            return out.last_hidden_state, out.pooler_output
    else:
        _, _, PlainBert = plain_modules()
        model = build_on_device(lambda: PlainBert(c), dev, torch.float32).eval()

        def forward(ids, mask):
            return model(ids, mask)
    settle()

    g = cpu_gen(30)

    def batch_inputs(batch, seq):
        ids = rand_tokens(g, c["vocab"], batch, seq)
        # Padding: each row keeps between half and all of its tokens.
        keep = torch.randint(max(1, seq // 2), seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < keep[:, None]).long()
        return ids.to(dev), mask.to(dev)

    def infer(batch, seq):
        ids, mask = batch_inputs(batch, seq)
        with torch.inference_mode():
            hidden, pooled = forward(ids, mask)
            h = hidden.float()
            stride = max(1, h.shape[-1] // 16)
            # Sample valid positions only (padded positions differ between implementations by design).
            sample = torch.cat([h[0, 0, ::stride], h[-1, 0, ::stride], h[0, 1 if seq > 1 else 0, ::stride],
                                pooled.float()[:, :8].reshape(-1)[:32], h[:, 0].abs().mean().reshape(1)])
        return sample

    t0 = time.perf_counter()
    for b, s in c["warmup"]:
        infer(b, s)
    torch.cuda.synchronize()
    timer.warmup_s = time.perf_counter() - t0

    samples = []
    t0 = time.perf_counter()
    for b, s in c["shapes"]:
        samples.append(infer(b, s))
    torch.cuda.synchronize()
    timer.wall_s = time.perf_counter() - t0
    snapshot_here()

    outputs = [common.group(f"batch{i}.outputs", s.cpu().tolist(), "maxabs_rel", 1e-3) for i, s in enumerate(samples)]
    finite = all(bool(torch.isfinite(s).all()) for s in samples)
    info = {"batches": len(c["shapes"]), "tokens": sum(b * s for b, s in c["shapes"])}
    return outputs, {"finite_outputs": finite}, info, finite


def run_side_stream(c, dev, impl, result, timer):
    """Integer tensors made on one stream and used on the next, freed (record_stream) while big
    matrix products keep the consuming stream busy, with new tensors written over freed memory on
    the producing stream. Every result is checked exactly; a reuse too early shows up as wrong
    elements. Phase one_side: default -> s -> default; phase four_sides: default -> s1 -> s2 -> s3
    -> s4 -> default (the case of four streams handing tensors between them)."""
    n_mm = c["matmul"]
    a_big = torch.randn(n_mm, n_mm, device=dev, dtype=torch.bfloat16)
    b_big = torch.randn(n_mm, n_mm, device=dev, dtype=torch.bfloat16)
    main = torch.cuda.current_stream(dev)
    ops = [(1, 1), (3, 0), (1, -5), (2, 7)]  # x -> x * a + b on each side stream in turn

    def expected_sum(n, m, hops):  # exact, in Python integers
        return common.affine_sum(n, m, [ops[k % len(ops)] for k in range(hops)])

    def phase(streams, iters, sizes):
        wrong = torch.zeros((), dtype=torch.int64, device=dev)
        sums = []
        for it in range(iters):
            n = sizes[it]
            m = it % 13 + 1
            x = (torch.arange(n, device=dev, dtype=torch.int32) * m) % 1000
            prev = main
            for k, s in enumerate(streams):
                s.wait_stream(prev)
                with torch.cuda.stream(s):
                    for _ in range(c["slow_matmuls"]):
                        slow = a_big @ b_big  # keeps s busy: what follows is queued behind it
                        del slow
                    a, b = ops[k % len(ops)]
                    y = x * a + b
                x.record_stream(s)
                del x  # dropped while s is still busy with it
                with torch.cuda.stream(prev):  # new memory on the producing stream, written at once
                    junk = torch.empty(n, device=dev, dtype=torch.int32)
                    junk.fill_(-77777)
                    del junk
                x = y
                del y
                prev = s
            main.wait_stream(prev)
            x.record_stream(main)
            ref = expected_gpu(n, m, len(streams))
            wrong += (x != ref).sum()
            sums.append(x.sum(dtype=torch.int64))
            del x, ref
        return wrong, sums

    def expected_gpu(n, m, hops):  # the same formula recomputed on the main stream only
        x = (torch.arange(n, device=dev, dtype=torch.int64) * m) % 1000
        for k in range(hops):
            a, b = ops[k % len(ops)]
            x = x * a + b
        return x.to(torch.int32)

    settle()
    one = [torch.cuda.Stream(device=dev)]
    four = [torch.cuda.Stream(device=dev) for _ in range(4)]
    sizes = c["sizes"]

    t0 = time.perf_counter()
    phase(one, 2, sizes[:2])
    phase(four, 2, sizes[:2])
    torch.cuda.synchronize()
    timer.warmup_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    wrong1, sums1 = phase(one, c["iters"], sizes)
    wrong4, sums4 = phase(four, c["iters"], sizes)
    torch.cuda.synchronize()
    timer.wall_s = time.perf_counter() - t0
    snapshot_here()

    sums1 = torch.stack(sums1).cpu().tolist()
    sums4 = torch.stack(sums4).cpu().tolist()
    wrong_sums1 = sum(1 for it, v in enumerate(sums1) if v != expected_sum(sizes[it], it % 13 + 1, 1))
    wrong_sums4 = sum(1 for it, v in enumerate(sums4) if v != expected_sum(sizes[it], it % 13 + 1, 4))
    checks = {"one_side.wrong_elements": int(wrong1), "one_side.wrong_sums": wrong_sums1,
              "four_sides.wrong_elements": int(wrong4), "four_sides.wrong_sums": wrong_sums4}
    ok = all(v == 0 for v in checks.values())
    outputs = [common.group("one_side.sums", sums1, "exact"), common.group("four_sides.sums", sums4, "exact")]
    info = {"iters": c["iters"], "elements": sum(sizes), "matmul": n_mm, "slow_matmuls_per_hop": c["slow_matmuls"]}
    return outputs, checks, info, ok


RUNNERS = {"llama_gen": run_llama, "gpt2_train": run_gpt2, "bert_infer": run_bert, "side_stream": run_side_stream}
USES_TRANSFORMERS = ("llama_gen", "gpt2_train", "bert_infer")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=sorted(RUNNERS))
    p.add_argument("--allocator", required=True, choices=common.TORCH_ALLOCATORS)
    p.add_argument("--lib", default=None, help="libdevrt_c.so (allocator devrt; default build/release/runtime/)")
    p.add_argument("--out", default=None, help="the JSON result file")
    p.add_argument("--small", action="store_true", help="smaller models and fewer steps (a quick pass)")
    p.add_argument("--impl", default="auto", choices=("auto", "transformers", "plain"),
                   help="models from transformers or plain torch.nn (auto: transformers, exit 3 if unusable)")
    p.add_argument("--deterministic", type=int, default=1, choices=(0, 1),
                   help="torch.use_deterministic_algorithms(warn_only) and a fixed cuBLAS workspace (default 1)")
    p.add_argument("--snapshot", default=None,
                   help="allocator devrt: record devrt's memory history and write its snapshot (a pickle for "
                        "torch.cuda._memory_viz) at the end of the measured part, and PATH.stats.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    impl = args.impl
    if args.workload not in USES_TRANSFORMERS:
        impl = "plain"
    elif impl == "auto":
        impl = "transformers"
    global ALLOCATOR, SNAPSHOT
    ALLOCATOR = args.allocator
    SNAPSHOT = args.snapshot
    result = common.new_result(args.workload, args.allocator, impl, args.small)
    lib_path = common.check_library(args.lib) if args.allocator == "devrt" else None
    if args.deterministic:
        # Set before CUDA starts: cuBLAS reads it when it creates its handle.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import_torch(args.allocator, lib_path)
    if SNAPSHOT is not None and args.allocator == "devrt":
        import devrt.torch  # noqa: PLC0415

        devrt.torch.record_memory_history(True, max_entries=1_000_000)
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            import torch.utils.deterministic as det  # noqa: PLC0415
        except ImportError:
            det = None
        if det is not None and hasattr(det, "fill_uninitialized_memory"):
            det.fill_uninitialized_memory = False  # would add fills that a normal run does not do
    dev = torch.device("cuda", 0)
    result["info"].update({
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
        "python": sys.version.split()[0], "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "deterministic": bool(args.deterministic), "lib": lib_path, "pid": os.getpid()})
    c = CONFIGS[args.workload](args.small)
    result["config"] = {k: v for k, v in c.items() if not isinstance(v, list)}
    seed_all()
    timer = Timer()

    # Each runner: build -> settle() (free what building left cached, reset the peaks) -> warm-up
    # -> measured part. The peaks cover warm-up and measured part, with the model's weights resident.
    code = common.EXIT_OK
    try:
        outputs, checks, info, ok = RUNNERS[args.workload](c, dev, impl, result, timer)
        torch.cuda.synchronize()
        result.update(memory_figures(args.allocator))
        result["wall_s"] = timer.wall_s
        result["warmup_s"] = timer.warmup_s
        result["outputs"] = outputs
        result["checks"] = checks
        result["info"].update(info)
        result["check_ok"] = bool(ok)
        free_b, total_b = torch.cuda.mem_get_info(0)
        result["info"]["device_used_bytes_end"] = total_b - free_b
        if args.allocator == "devrt" and not result.get("allocations"):
            result["check_ok"] = False
            result["error"] = "devrt served no allocation: devrt.torch.install() did not take effect"
            code = common.EXIT_WRONG
        elif not ok:
            result["error"] = f"wrong result: {checks}"
            code = common.EXIT_WRONG
        else:
            result["ok"] = True
    except TransformersUnusable as e:
        result["error"] = f"transformers path unusable: {e}"
        code = common.EXIT_NO_TRANSFORMERS if args.impl == "auto" else common.EXIT_SETUP
        print(f"torch_bench: {result['error']}", file=sys.stderr)
        if args.impl == "auto":
            print("torch_bench: rerun with --impl plain (run_all.py does this by itself)", file=sys.stderr)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        code = common.EXIT_SETUP
    common.write_result(args.out, result)
    status = "ok" if code == 0 else f"FAILED ({result['error']})"
    wall = f"{result['wall_s']:.3f} s" if result.get("wall_s") is not None else "-"
    print(f"{args.workload} [{args.allocator}, {impl}]: {status}; wall {wall}, peak reserved "
          f"{result.get('peak_reserved_bytes')}, peak live {result.get('peak_live_bytes')}; checks {result['checks']}",
          flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
