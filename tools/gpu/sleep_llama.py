#!/usr/bin/env python3
"""Sleep and wake under PyTorch on a GPU, with a small Llama-style model (transformers' LlamaForCausalLM
built from a LlamaConfig with seeded random weights: nothing is downloaded).

    PYTHONPATH=python python3 tools/gpu/sleep_llama.py                  # both modes, one process each
    PYTHONPATH=python python3 tools/gpu/sleep_llama.py --mode install   # devrt.torch.install()
    PYTHONPATH=python python3 tools/gpu/sleep_llama.py --mode mempool   # MemPools, no install()

One line per check, "sleep_llama: <check>: PASS|FAIL <figures>"; the exit code is 1 when a check
failed. The checks:

  --mode install (devrt is PyTorch's allocator; weights made under devrt.torch.tag("weights"), the
  StaticCache under tag "kv_cache"):
    level1      greedy generation, then devrt.torch.sleep(("weights", "kv_cache"), keep=("weights",)):
                torch.cuda.mem_get_info gains >= 95% of the sleeping bytes, a raw cuMemAlloc of 90%
                of the free memory succeeds (and is freed), an allocation under a sleeping tag is
                refused (DEVRT_ERROR_ASLEEP); wake_up(), the cache reset, generation again: the
                same tokens and bit-identical logits
    devrt_reuse while asleep, PyTorch itself (through devrt, untagged) takes 90% of the free memory
    wake_oom    with the GPU filled by a raw cuMemAlloc, wake_up() raises DevrtOutOfMemoryError and
                the tags stay asleep; once freed, wake_up() succeeds and the outputs are unchanged
    level2      sleep with keep=(), wake_up(), the buffers restored and the weights of a second model
                (another seed, built on the CPU) copied in: the outputs equal that model's, run eagerly
  --mode mempool (PyTorch's own allocator, CUDA initialised first, no install(); weights and cache
  made under devrt.torch.use_mem_pool("weights") / use_mem_pool("kv_cache")):
    level1      as above (the 90% taken by PyTorch's own allocator)
    level2      as above
    cuda_graph  a torch.cuda.CUDAGraph of one decode step captured before sleep; level-1 sleep and
                wake, the cache refilled by an eager prefill, the graph replayed: its output equals
                the pre-sleep replay's. (Under install() PyTorch's graph capture is not served by
                devrt: the README's "Not supported".)

Bit-identical outputs need bit-reproducible kernels: torch.use_deterministic_algorithms is on and
attention runs on SDPA's math backend (--sdpa math, the default). With PyTorch's own SDPA choice
(--sdpa default) two greedy runs in a row, with no sleep between them, already differed on the H200
(torch 2.11, transformers 5.17: max |diff| 0.06 in the logits), so equality could not be checked
there. About 45 s on an H200 for both modes.
"""

from __future__ import annotations

import argparse
import ctypes
import inspect
import os
import subprocess
import sys
import time
import traceback

# Bit-identical cuBLAS results across streams and runs (set before CUDA starts).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

GiB = 1 << 30
MiB = 1 << 20
_failed = []


def report(check: str, ok: bool, figures: str) -> None:
    print(f"sleep_llama: {check}: {'PASS' if ok else 'FAIL'} {figures}", flush=True)
    if not ok:
        _failed.append(check)


def run_check(check: str, fn, *args) -> None:
    try:
        ok, figures = fn(*args)
    except Exception as e:  # noqa: BLE001 (each check reports its own failure and the others run)
        traceback.print_exc()
        ok, figures = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    report(check, ok, figures)


def gib(n: float) -> str:
    return f"{n / GiB:.3f} GiB"


# ---- the raw driver (memory that neither PyTorch nor devrt knows) ----

class Driver:
    def __init__(self, device: int):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.cu.cuMemAlloc_v2.restype = ctypes.c_int
        self.cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.cu.cuMemFree_v2.restype = ctypes.c_int
        ctx = ctypes.c_void_p()
        self.cu.cuCtxGetCurrent(ctypes.byref(ctx))
        if not ctx.value:  # PyTorch made the primary context current on this thread; make sure
            dev = ctypes.c_int()
            self.cu.cuDeviceGet(ctypes.byref(dev), device)
            self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
            self.cu.cuCtxSetCurrent(ctx)

    def alloc(self, nbytes: int, step: int = 256 * MiB, tries: int = 16):
        """cuMemAlloc of `nbytes`, or of 256 MiB less each time the driver refuses; (ptr, size)."""
        for _ in range(tries):
            if nbytes <= 0:
                break
            p = ctypes.c_uint64()
            if self.cu.cuMemAlloc_v2(ctypes.byref(p), nbytes) == 0:
                return p.value, nbytes
            nbytes -= step
        raise MemoryError(f"cuMemAlloc refused every size down to {nbytes + step} bytes")

    def free(self, ptr: int) -> None:
        r = self.cu.cuMemFree_v2(ptr)
        if r != 0:
            raise RuntimeError(f"cuMemFree failed: CUresult {r}")


# ---- the model ----

class Setup:
    """A model, its StaticCache and the tensors in each tag, made the way the mode says."""

    def __init__(self, args, mode: str):
        import torch

        self.torch = torch
        self.args = args
        self.mode = mode
        self.dev = torch.device("cuda", 0)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
        from transformers import LlamaConfig

        self.config = LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
            max_position_embeddings=max(4096, args.cache_len), tie_word_embeddings=False)
        g = torch.Generator().manual_seed(1234)
        self.prompt = torch.randint(0, args.vocab, (args.batch, args.prompt), generator=g).to(self.dev)
        # cuBLAS's workspace comes with the first matrix product on a stream: make it now, untagged, so
        # that it is in no tag that sleeps.
        x = torch.ones(64, 64, device=self.dev, dtype=self.dtype)
        (x @ x).sum().item()

    def tagged(self, name: str):
        import devrt.torch as dt

        return dt.use_mem_pool(name) if self.mode == "mempool" else dt.tag(name)

    def build(self, seed: int, device):
        torch = self.torch
        from transformers import LlamaForCausalLM

        torch.manual_seed(seed)
        previous = torch.get_default_dtype()
        # On the GPU the model is made in its dtype (no float32 copy in the tag); on the CPU in float32,
        # whose initialisation is the faster there, then converted.
        torch.set_default_dtype(self.dtype if torch.device(device).type == "cuda" else torch.float32)
        try:
            with torch.device(device):
                model = LlamaForCausalLM(self.config)
        finally:
            torch.set_default_dtype(previous)
        return model.to(self.dtype).eval().requires_grad_(False)

    def make_cache(self):
        from transformers import StaticCache

        params = inspect.signature(StaticCache.__init__).parameters
        kw = {"config": self.config, "max_cache_len": self.args.cache_len}
        for name in ("max_batch_size", "batch_size"):
            if name in params:
                kw[name] = self.args.batch
                break
        if "device" in params:
            kw["device"] = self.dev
        if "dtype" in params:
            kw["dtype"] = self.dtype
        cache = StaticCache(**kw)
        early = getattr(cache, "early_initialization", None)
        if early is not None:  # transformers 5: layers are made on their first update unless asked now
            head_dim = getattr(self.config, "head_dim", None) or self.args.hidden // self.args.heads
            try:
                early(batch_size=self.args.batch, num_heads=self.args.kv_heads, head_dim=head_dim, dtype=self.dtype,
                      device=self.dev)
            except Exception:  # noqa: BLE001 (another signature: the first prefill, under the tag too, makes them)
                pass
        return cache

    def cache_tensors(self, cache):
        out = []
        layers = getattr(cache, "layers", None)
        if layers is not None:
            for layer in layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name, None)
                    if isinstance(t, self.torch.Tensor) and t.device.type == "cuda":
                        out.append(t)
        for name in ("key_cache", "value_cache"):
            for t in getattr(cache, name, None) or []:
                if isinstance(t, self.torch.Tensor) and t.device.type == "cuda":
                    out.append(t)
        return out

    def forward(self, model, cache, ids, start: int):
        torch = self.torch
        pos = torch.arange(start, start + ids.shape[1], device=self.dev)
        out = model(input_ids=ids, past_key_values=cache, cache_position=pos,
                    position_ids=pos.unsqueeze(0).expand(ids.shape[0], -1), use_cache=True)
        return out.logits[:, -1, :]

    def generate(self, model, cache, n=None):
        """Greedy: the cache reset, the prompt, then n-1 decode steps; (tokens, logits) of each step."""
        torch = self.torch
        n = n or self.args.tokens
        with torch.no_grad():
            cache.reset()
            logits = [self.forward(model, cache, self.prompt, 0)]
            toks = [logits[-1].argmax(-1, keepdim=True)]
            for i in range(n - 1):
                logits.append(self.forward(model, cache, toks[-1], self.args.prompt + i))
                toks.append(logits[-1].argmax(-1, keepdim=True))
            return torch.cat(toks, 1), torch.stack(logits, 1)

    def setup_tagged(self):
        """The model under "weights", the cache (and its first prefill) under "kv_cache"."""
        with self.tagged("weights"):
            self.model = self.build(1, self.dev)
        with self.tagged("kv_cache"):
            self.cache = self.make_cache()
            with self.torch.no_grad():
                self.cache.reset()
                self.forward(self.model, self.cache, self.prompt, 0)
        self.torch.cuda.synchronize()
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters()) + sum(
            b.numel() * b.element_size() for b in self.model.buffers())
        kv = self.cache_tensors(self.cache)
        if not kv:
            raise RuntimeError("the StaticCache holds no CUDA tensors after a prefill (unknown layout)")
        self.kv_bytes = sum(t.numel() * t.element_size() for t in kv)


def stats():
    import devrt

    return devrt.stats(0)


def same(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(a, b)


def diff(a, b) -> str:
    """Where two (batch, step, vocab) logits differ: the first step and the largest difference."""
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
    d = (a.float() - b.float()).abs()
    steps = (d.flatten(2).amax(dim=(0, 2)) > 0).nonzero()
    first = int(steps[0]) if len(steps) else -1
    return f"max |diff| {float(d.max()):.3g}, first differing step {first}"


def snapshot(model):
    return [t.detach().to("cpu", copy=True) for t in list(model.parameters()) + list(model.buffers())]


def same_snapshot(model, snap) -> bool:
    now = list(model.parameters()) + list(model.buffers())
    return len(now) == len(snap) and all(same(t.detach().cpu(), c) for t, c in zip(now, snap))


def check_level1(s: Setup, hog_with_torch: bool):
    """Level 1, checked against the outputs before the sleep."""
    import devrt
    import devrt.torch as dt
    torch = s.torch

    tokens, logits = s.generate(s.model, s.cache)
    tokens_again, logits_again = s.generate(s.model, s.cache)
    repeatable = same(tokens, tokens_again) and same(logits, logits_again)
    weights_before = snapshot(s.model)
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info(0)
    st0 = stats()
    t0 = time.perf_counter()
    dt.sleep(("weights", "kv_cache"), keep=("weights",))
    t_sleep = time.perf_counter() - t0
    free1, _ = torch.cuda.mem_get_info(0)
    st1 = stats()
    sleeping = st1["sleeping_bytes"]
    back = free1 - free0
    tagged = s.weight_bytes + s.kv_bytes
    ok_back = sleeping >= tagged and back >= 0.95 * sleeping
    problems = []
    if sleeping < tagged:
        problems.append(f"sleeping {sleeping} < tensors in the tags {tagged}")
    if back < 0.95 * sleeping:
        problems.append(f"mem_get_info gained {back} < 95% of {sleeping}")

    # Someone else takes 90% of what is free now.
    want = int(free1 * 0.9)
    if hog_with_torch:  # PyTorch's own allocator (mempool mode)
        hog = torch.empty(want, dtype=torch.uint8, device=s.dev)
        hog.fill_(1)
        torch.cuda.synchronize()
        got = hog.numel()
        del hog
        torch.cuda.empty_cache()
    else:
        drv = Driver(0)
        ptr, got = drv.alloc(want)
        drv.free(ptr)
    ok_hog = got >= want - 1 * GiB

    # Allocating under a sleeping tag is refused.
    refused = False
    if s.mode == "install":
        try:
            with dt.tag("weights"):
                torch.empty(1024, device=s.dev)
        except RuntimeError as e:
            refused = "asleep" in str(e)
            if not refused:
                problems.append(f"allocation under a sleeping tag: unexpected error {e}")
    else:
        try:
            with dt.use_mem_pool("weights"):
                torch.empty(1024, device=s.dev)
        except devrt.DevrtError as e:
            refused = e.status == devrt.ERROR_ASLEEP
    if not refused:
        problems.append("an allocation under the sleeping tag was not refused")

    t0 = time.perf_counter()
    dt.wake_up()
    t_wake = time.perf_counter() - t0
    st2 = stats()
    weights_exact = same_snapshot(s.model, weights_before)
    del weights_before
    if not weights_exact:
        problems.append("the weights (parameters and buffers) differ from their bytes before the sleep")
    tokens2, logits2 = s.generate(s.model, s.cache)
    equal = same(tokens, tokens2) and same(logits, logits2)
    if not equal:
        problems.append(f"outputs differ: tokens equal {same(tokens, tokens2)}, logits equal {same(logits, logits2)} "
                        f"({diff(logits, logits2)}); two runs before the sleep equal {repeatable}"
                        + ("" if repeatable else f" ({diff(logits, logits_again)})"))
    if st2["sleeping_bytes"] != 0 or st2["wakes"] < st0["wakes"] + 2 or st1["sleeps"] < st0["sleeps"] + 2:
        problems.append(f"counters: sleeps {st0['sleeps']}->{st1['sleeps']}, wakes {st0['wakes']}->{st2['wakes']}, "
                        f"sleeping after wake {st2['sleeping_bytes']}")
    if not ok_hog:
        problems.append(f"the 90% allocation got {got} of {want}")
    ok = ok_back and ok_hog and refused and equal and weights_exact and not problems
    figures = (f"tokens {tuple(tokens.shape)} equal {same(tokens, tokens2)}, logits equal {same(logits, logits2)}, "
               f"weights byte-exact {weights_exact}; "
               f"weights {gib(s.weight_bytes)} + kv_cache {gib(s.kv_bytes)}, sleeping {gib(sleeping)}, "
               f"offloaded {gib(st1['offloaded_bytes'])}, mem_get_info +{gib(back)} "
               f"({100.0 * back / max(sleeping, 1):.1f}%), 90% of free taken by "
               f"{'PyTorch' if hog_with_torch else 'cuMemAlloc'}: {gib(got)}; asleep malloc refused {refused}; "
               f"sleep {t_sleep * 1e3:.1f} ms, wake {t_wake * 1e3:.1f} ms")
    if problems:
        figures += "; " + "; ".join(problems)
    s.reference = (tokens, logits)
    return ok, figures


def check_devrt_reuse(s: Setup):
    """While the tags sleep, PyTorch (through devrt, untagged) takes 90% of the free memory."""
    import devrt.torch as dt
    torch = s.torch

    dt.sleep(("weights", "kv_cache"), keep=("weights",))
    free1, _ = torch.cuda.mem_get_info(0)
    want = int(free1 * 0.9)
    t0 = time.perf_counter()
    hog = torch.empty(want, dtype=torch.uint8, device=s.dev)
    hog.fill_(7)
    torch.cuda.synchronize()
    t_hog = time.perf_counter() - t0
    ok_fill = bool(hog[-1].item() == 7)
    del hog
    dt.empty_cache()
    dt.wake_up()
    tokens, logits = s.generate(s.model, s.cache)
    equal = same(tokens, s.reference[0]) and same(logits, s.reference[1])
    return ok_fill and equal, (f"{gib(want)} of {gib(free1)} free taken through devrt in {t_hog:.2f} s; "
                               f"outputs after wake equal {equal}"
                               + ("" if equal else f" ({diff(logits, s.reference[1])})"))


def check_wake_oom(s: Setup):
    import devrt
    import devrt.torch as dt
    torch = s.torch

    dt.sleep(("weights", "kv_cache"), keep=("weights",))
    st1 = stats()
    free1, _ = torch.cuda.mem_get_info(0)
    drv = Driver(0)
    ptr, got = drv.alloc(free1 - 256 * MiB)
    raised = None
    try:
        dt.wake_up()
    except devrt.DevrtOutOfMemoryError as e:
        raised = e
    except devrt.DevrtError as e:
        raised = e
    finally:
        st2 = stats()
        still = dt.sleeping()
        drv.free(ptr)
    ok_raise = isinstance(raised, devrt.DevrtOutOfMemoryError)
    ok_asleep = set(still) == {"weights", "kv_cache"} and st2["sleeping_bytes"] == st1["sleeping_bytes"]
    dt.wake_up()
    tokens, logits = s.generate(s.model, s.cache)
    equal = same(tokens, s.reference[0]) and same(logits, s.reference[1])
    msg = (str(raised).splitlines()[0][:160] if raised else "nothing raised")
    return ok_raise and ok_asleep and equal, (
        f"held {gib(got)} by cuMemAlloc, wake_up raised {type(raised).__name__ if raised else None} ({msg}); "
        f"still asleep {sorted(still)}, sleeping {gib(st2['sleeping_bytes'])}; after freeing, wake_up and "
        f"outputs equal {equal}" + ("" if equal else f" ({diff(logits, s.reference[1])})"))


def check_level2(s: Setup):
    import devrt.torch as dt
    torch = s.torch

    t0 = time.perf_counter()
    other = s.build(2, "cpu")
    t_build = time.perf_counter() - t0
    new_state = other.state_dict()
    # Buffers that are not in the state dict (rotary inv_freq) live in the weights tag too and a
    # level-2 sleep loses them: they are loaded from the new model as well (vLLM saves them instead).
    new_buffers = {n: b.detach() for n, b in other.named_buffers()}
    st0 = stats()
    dt.sleep(("weights", "kv_cache"), keep=())
    st1 = stats()
    offloaded = st1["offloaded_bytes"]
    t0 = time.perf_counter()
    dt.wake_up()
    t_wake = time.perf_counter() - t0
    with torch.no_grad():
        for name, t in s.model.state_dict().items():
            t.copy_(new_state[name])
        for name, b in s.model.named_buffers():
            b.copy_(new_buffers[name])
    tokens, logits = s.generate(s.model, s.cache)
    fresh = other.to(s.dev)  # the second model on the GPU, untagged, with a cache of its own
    fresh_cache = s.make_cache()
    ref_tokens, ref_logits = s.generate(fresh, fresh_cache)
    equal = same(tokens, ref_tokens) and same(logits, ref_logits)
    differs = not same(tokens, s.reference[0]) or not same(logits, s.reference[1])
    del fresh, fresh_cache, other
    torch.cuda.synchronize()
    return equal and differs and offloaded == 0, (
        f"keep=(): offloaded {gib(offloaded)}, sleeping {gib(st1['sleeping_bytes'])} "
        f"(sleeps {st0['sleeps']}->{st1['sleeps']}); wake {t_wake * 1e3:.1f} ms; the second model (built on the "
        f"CPU in {t_build:.1f} s) loaded: tokens equal {same(tokens, ref_tokens)}, logits equal "
        f"{same(logits, ref_logits)} to the fresh model's"
        + ("" if equal else f" ({diff(logits, ref_logits)})") + f"; differ from the first model's {differs}")


def check_cuda_graph(s: Setup):
    """A decode step captured before sleep, replayed after level-1 sleep and wake."""
    import devrt.torch as dt
    torch = s.torch
    model, cache, P, B = s.model, s.cache, s.args.prompt, s.args.batch

    def prefill():
        with torch.no_grad():
            cache.reset()
            return s.forward(model, cache, s.prompt, 0).argmax(-1, keepdim=True)

    static_ids = torch.zeros(B, 1, dtype=torch.long, device=s.dev)
    static_pos = torch.tensor([P], dtype=torch.long, device=s.dev)
    static_posids = static_pos.unsqueeze(0).expand(B, 1).contiguous()

    def step():
        out = model(input_ids=static_ids, past_key_values=cache, cache_position=static_pos,
                    position_ids=static_posids, use_cache=True)
        return out.logits[:, -1, :]

    static_ids.copy_(prefill())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = step()

    tok0 = prefill()
    static_ids.copy_(tok0)
    graph.replay()
    before = static_out.clone()
    tok0_eager = prefill()  # the same step run eagerly, on a cache refilled
    with torch.no_grad():
        eager = s.forward(model, cache, tok0_eager, P)
    eager_equal = same(eager, before)
    torch.cuda.synchronize()

    t0 = time.perf_counter()
    dt.sleep(("weights", "kv_cache"), keep=("weights",))
    t_sleep = time.perf_counter() - t0
    st = stats()
    t0 = time.perf_counter()
    dt.wake_up()
    t_wake = time.perf_counter() - t0
    tok1 = prefill()
    static_ids.copy_(tok1)
    graph.replay()
    after = static_out.clone()
    torch.cuda.synchronize()
    ok = same(tok0, tok1) and same(before, after)
    del graph
    return ok, (f"replay after sleep/wake equals the one before {same(before, after)} (first token equal "
                f"{same(tok0, tok1)}; the replay equals an eager step {eager_equal}); slept {gib(st['sleeping_bytes'])}, "
                f"sleep {t_sleep * 1e3:.1f} ms, wake {t_wake * 1e3:.1f} ms")


def deterministic(args) -> None:
    import torch

    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if args.sdpa != "default":  # one attention backend only
        b = torch.backends.cuda
        b.enable_flash_sdp(args.sdpa == "flash")
        b.enable_mem_efficient_sdp(args.sdpa == "efficient")
        b.enable_math_sdp(args.sdpa == "math")
        if hasattr(b, "enable_cudnn_sdp"):
            b.enable_cudnn_sdp(args.sdpa == "cudnn")


def main_install(args) -> int:
    import torch

    deterministic(args)

    import devrt.torch as dt

    dt.install()  # before the first CUDA tensor
    if not torch.cuda.is_available():
        report("setup", False, "no CUDA device")
        return 1
    t0 = time.perf_counter()
    s = Setup(args, "install")
    s.setup_tagged()
    report("setup", True, f"install(): {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, {args.dtype}, "
           f"batch {args.batch}, prompt {args.prompt}, {args.tokens} tokens, cache {args.cache_len}; weights "
           f"{gib(s.weight_bytes)}, kv_cache {gib(s.kv_bytes)}; devrt reserved {gib(stats()['reserved_bytes'])} "
           f"({time.perf_counter() - t0:.1f} s); deterministic algorithms {args.deterministic}, sdpa {args.sdpa}")
    run_check("level1", check_level1, s, False)
    if hasattr(s, "reference"):
        run_check("devrt_reuse", check_devrt_reuse, s)
        run_check("wake_oom", check_wake_oom, s)
        run_check("level2", check_level2, s)
    return 1 if _failed else 0


def main_mempool(args) -> int:
    import torch

    deterministic(args)

    if not torch.cuda.is_available():
        report("setup", False, "no CUDA device")
        return 1
    torch.zeros(1, device="cuda").sum().item()  # CUDA initialised, PyTorch's own allocator in use
    import devrt.torch as dt

    t0 = time.perf_counter()
    s = Setup(args, "mempool")
    s.setup_tagged()
    pools = {name: dt.pool(name).id for name in ("weights", "kv_cache")}
    report("setup", True, f"MemPools {pools}, no install(): {args.layers} layers, hidden {args.hidden}, "
           f"{args.dtype}, batch {args.batch}; weights {gib(s.weight_bytes)}, kv_cache {gib(s.kv_bytes)}; devrt "
           f"reserved {gib(stats()['reserved_bytes'])}, PyTorch reserved {gib(torch.cuda.memory_reserved())} "
           f"({time.perf_counter() - t0:.1f} s); deterministic algorithms {args.deterministic}, sdpa {args.sdpa}")
    run_check("level1", check_level1, s, True)
    if hasattr(s, "reference"):
        run_check("cuda_graph", check_cuda_graph, s)
        run_check("level2", check_level2, s)
    return 1 if _failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("all", "install", "mempool"), default="all")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cache-len", type=int, default=2048)
    ap.add_argument("--sdpa", choices=("default", "math", "efficient", "flash", "cudnn"), default="math",
                    help="the attention backend: math (the default) is bit-reproducible run to run; PyTorch's own choice (default) was not on the H200")
    ap.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                    help="leave torch.use_deterministic_algorithms off")
    args, rest = ap.parse_known_args()
    if rest:
        ap.error(f"unknown arguments {rest}")
    if args.mode == "all":
        rc = 0
        passthrough, skip = [], False
        for a in sys.argv[1:]:
            if skip or a.startswith("--mode="):
                skip = False
                continue
            if a == "--mode":
                skip = True
                continue
            passthrough.append(a)
        for mode in ("install", "mempool"):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode, *passthrough])
            print(f"sleep_llama: mode {mode}: {'PASS' if r.returncode == 0 else 'FAIL'} exit {r.returncode} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            rc |= r.returncode != 0
        return 1 if rc else 0
    return main_install(args) if args.mode == "install" else main_mempool(args)


if __name__ == "__main__":
    sys.exit(main())
