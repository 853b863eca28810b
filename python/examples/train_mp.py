#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Train a small transformer-like model in several worker processes on one
GPU, with RMSNorm's backward pass in rmsnormd (--impl daemon) or PyTorch's own
torch.nn.RMSNorm (--impl torch), and write each worker's loss curve, step
times and a hash of its final parameters to a JSON file.

    python3 train_mp.py --impl daemon --workers 4 --steps 300 --out run.json

Every worker trains its own model on its own synthetic data (a fixed random
Markov chain over the vocabulary, so the loss has something to learn), seeded
from --seed and its rank, with PyTorch's deterministic algorithms on: two runs
with the same arguments must give the same bits.  compare_runs.py judges the
files.  The daemon is found at $RMSNORMD_ENDPOINT (or the default endpoint);
the workers are spawned (not forked) as libclient requires.
"""

import argparse
import hashlib
import json
import math
import os
import queue as queue_mod
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


class Block(nn.Module):
    def __init__(self, d, heads, norm):
        super().__init__()
        self.heads = heads
        self.n1 = norm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.n2 = norm(d)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.n1(x)
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        # Plain attention (matmul + softmax): every kernel of it is
        # deterministic, so runs can be compared bit for bit.
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.down(F.silu(self.up(self.n2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq, norm):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, norm) for _ in range(layers))
        self.norm = norm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1),
                             persistent=False)

    def forward(self, idx):
        # The embedding as a one-hot product: its backward is a matmul, with
        # no scatter-add whose order could vary between runs.
        x = F.one_hot(idx, self.emb.num_embeddings).to(self.pos.dtype) @ self.emb.weight
        x = x + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x, self.mask[: idx.shape[1], : idx.shape[1]])
        return self.head(self.norm(x))


def make_data(seed, vocab, steps, batch, seq):
    """Sequences from a sparse random Markov chain (each token has 4 likely
    successors): learnable structure, no files.  Made on the CPU, where every
    step is sequential, so the data are the same bits in every run."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.full((vocab, vocab), -4.0)
    succ = torch.randint(0, vocab, (vocab, 4), generator=gen)
    for k, v in enumerate((3.0, 2.0, 1.0, 0.5)):
        logits[torch.arange(vocab), succ[:, k]] = v
    probs = logits.softmax(-1)
    n = steps * batch
    toks = torch.empty(n, seq + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, vocab, (n,), generator=gen)
    for t in range(seq):
        toks[:, t + 1] = torch.multinomial(probs[toks[:, t]], 1, generator=gen).squeeze(1)
    return toks.view(steps, batch, seq + 1)


def param_hash(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        u8 = p.detach().contiguous().view(-1).view(torch.uint8).cpu()
        try:
            data = u8.numpy().tobytes()
        except RuntimeError:  # PyTorch without numpy: slower, same bytes
            data = bytes(u8.tolist())
        h.update(data)
    return h.hexdigest()


class Trainer:
    """One model of one worker: its norm (rmsnormd's or torch.nn.RMSNorm),
    data, optimizer, and what its steps recorded."""

    def __init__(self, impl, rank, args, dev, dtype, data, calls):
        self.impl, self.args, self.calls = impl, args, calls
        self.client = None
        if impl == "daemon":
            import rmsnormd
            import rmsnormd.torch as rnt
            # CUDA tensors use the process's default client; CPU tensors go
            # to the daemon (its CPU backend) only with a client given
            # explicitly.
            self.client = None if dev.type == "cuda" else rmsnormd.Client(
                name="train_mp rank %d" % rank)
            norm = lambda d: rnt.RMSNorm(d, eps=1e-6, client=self.client)  # noqa: E731
        else:
            norm = lambda d: nn.RMSNorm(d, eps=1e-6)  # noqa: E731
        # The same seed for either norm: with --impl both the two models
        # start from the same weights (and see the same data, made once).
        torch.manual_seed(args.seed * 1000 + rank)
        self.model = TinyLM(args.vocab, args.dim, args.heads, args.layers, args.seq,
                            norm).to(dev, dtype)
        self.data = data
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.01,
                                     betas=(0.9, 0.95), eps=1e-6, foreach=False)
        self.cuda = dev.type == "cuda"
        self.losses, self.times = [], []
        # --phases: where a step's time goes (host ms of each phase, the
        # GPU's span of the step on this stream, the host time of
        # rmsnormd's backward calls), to tell a host cost from a GPU one.
        self.phases = [] if args.phases else None

    def step(self, step):
        args, model, opt = self.args, self.model, self.opt
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        ev = None
        if self.phases is not None:
            if self.cuda:
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                ev[0].record()
            ncalls = len(self.calls)
        lr = args.lr * min(1.0, (step + 1) / 20)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = self.data[step]
        logits = model(batch[:, :-1])
        # Cross entropy through a one-hot mask (no gather/scatter: see above).
        logp = logits.float().reshape(-1, args.vocab).log_softmax(-1)
        target = F.one_hot(batch[:, 1:].reshape(-1), args.vocab).to(logp.dtype)
        loss = -(logp * target).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if ev:
            ev[1].record()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()
        t3 = time.perf_counter()
        if ev:
            ev[2].record()
        lv = loss.item()  # synchronises: the step is complete
        t4 = time.perf_counter()
        self.times.append(t4 - t0)
        self.losses.append(lv)
        if self.phases is not None:
            self.phases.append({
                "fwd": 1000 * (t1 - t0), "bwd": 1000 * (t2 - t1), "opt": 1000 * (t3 - t2),
                "sync": 1000 * (t4 - t3),
                "gpu_to_bwd_end": ev[0].elapsed_time(ev[1]) if ev else 0.0,
                "gpu_step": ev[0].elapsed_time(ev[2]) if ev else 0.0,
                "calls_ms": 1000 * sum(self.calls[ncalls:]), "calls": len(self.calls) - ncalls})

    def result(self):
        r = {"losses": self.losses,
             "loss_bits": [float.hex(v) for v in self.losses],
             "step_ms": [1000 * t for t in self.times],
             "phases": self.phases,
             "param_sha256": param_hash(self.model)}
        if self.impl == "daemon":
            from rmsnormd.torch import default_client
            client = self.client or default_client()
            # On the fast path a failed call is reported at the next one: the
            # last step's calls have no next one, so ask (RNError if any
            # failed).
            client.sync()
            st = client.stats()
            r["daemon"] = {"bwd_requests_seen": st.get("requests.bwd"),
                           "backend": st.backend, "device": st.device}
        return r


def worker(rank, args, queue):
    cuda = args.device >= 0
    if cuda:
        torch.cuda.set_device(args.device)
    else:
        torch.set_num_threads(1)
    # warn_only: an op without a deterministic version shows up as a warning
    # and as a difference between the two PyTorch runs, not as a crash.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", args.device) if cuda else torch.device("cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]

    calls = []  # host seconds of each of rmsnormd's backward calls (--phases)
    if args.phases and args.impl != "torch":
        import rmsnormd.torch as rnt
        bwd = rnt._RMSNormFn.backward

        def timed_backward(ctx, dy):
            t = time.perf_counter()
            try:
                return bwd(ctx, dy)
            finally:
                calls.append(time.perf_counter() - t)
        rnt._RMSNormFn.backward = staticmethod(timed_backward)
    impls = ["daemon", "torch"] if args.impl == "both" else [args.impl]
    # (its own generator: the same bits whatever the global seed's state)
    data = make_data(args.seed * 1000 + rank, args.vocab, args.steps, args.batch,
                     args.seq).to(dev)
    trainers = [Trainer(impl, rank, args, dev, dtype, data, calls) for impl in impls]
    queue.put(("ready", rank))
    for step in range(args.steps):
        # --impl both: the two models take turns, in ABBA order (daemon
        # first on even steps, torch first on odd ones), so that both see
        # the same machine and a drift cancels.
        for t in trainers if step % 2 == 0 else trainers[::-1]:
            t.step(step)
    result = dict(trainers[0].result(), rank=rank)
    if len(trainers) > 1:
        result["torch"] = trainers[1].result()
    queue.put(("done", result))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["daemon", "torch", "both"], required=True,
                    help="the norm: rmsnormd's, torch.nn.RMSNorm, or both (two models a "
                         "worker, taking turns step by step: their step times side by side)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", type=int, default=0,
                    help="CUDA device; -1: the CPU (and the daemon's CPU backend), for a smoke test")
    ap.add_argument("--timeout", type=int, default=240, help="seconds for the whole run")
    ap.add_argument("--phases", action="store_true",
                    help="record each step's phases (host ms of forward, backward, optimizer "
                         "and the final wait; the GPU's span; rmsnormd's backward calls) in the JSON "
                         "and print their medians")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=worker, args=(r, args, queue)) for r in range(args.workers)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + args.timeout
    while len(results) < args.workers:
        try:
            kind, payload = queue.get(timeout=1.0)
        except queue_mod.Empty:
            # No message this second: fail at once if a worker died, rather
            # than waiting for the deadline.
            dead = [(p.pid, p.exitcode) for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    if p.exitcode is None:
                        p.kill()
                sys.exit("train_mp: workers failed (pid, exit code): %s%s" % (
                    dead, "" if dead else "; none finished within %d s" % args.timeout))
            continue
        if kind == "done":
            results[payload["rank"]] = payload
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            sys.exit("train_mp: worker %d exited with %s" % (p.pid, p.exitcode))
    out = {"args": vars(args), "wall_s": time.perf_counter() - t0,
           "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(args.device) if args.device >= 0 else "CPU",
           "workers": [results[r] for r in sorted(results)]}
    if args.impl == "both":
        r = interleaved_ratio(out)
        out["side_by_side"] = {"ratios": r, "mean": statistics.mean(r)}
    with open(args.out, "w") as f:
        json.dump(out, f)
    # What each model's workers did: (impl, that model's result per worker).
    runs = [(args.impl if args.impl != "both" else "daemon", out["workers"])]
    if args.impl == "both":
        runs.append(("torch", [w["torch"] for w in out["workers"]]))
    for impl, ws in runs:
        steady = [sum(w["step_ms"][20:]) / max(1, len(w["step_ms"][20:])) for w in ws]
        print("train_mp: impl=%s workers=%d steps=%d final loss %s; mean step %.2f ms; wall %.1f s"
              % (impl, args.workers, args.steps, ["%.4f" % w["losses"][-1] for w in ws],
                 sum(steady) / len(steady), out["wall_s"]))
        # Medians over every worker's steps after the 20 warm-up steps.
        rows = [p for w in ws for p in (w["phases"] or [])[20:]]
        if rows:
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print("train_mp: impl=%s phases (medians, ms): forward %.2f, backward %.2f, "
                  "optimizer %.2f, final wait %.2f; GPU span to backward's end %.2f, of the "
                  "step %.2f; rmsnormd's backward %.3f ms in %d calls"
                  % (impl, med["fwd"], med["bwd"], med["opt"], med["sync"],
                     med["gpu_to_bwd_end"], med["gpu_step"], med["calls_ms"], med["calls"]))
    if args.impl == "both":
        print("train_mp: side by side, median step daemon / torch per worker %s; mean %.3fx"
              % (["%.3f" % x for x in out["side_by_side"]["ratios"]],
                 out["side_by_side"]["mean"]))


def interleaved_ratio(run, warmup=20):
    """--impl both: per worker, its daemon model's median step over its
    torch model's (steps after warmup)."""
    out = []
    for w in run["workers"]:
        k = warmup if len(w["step_ms"]) > warmup else 0
        out.append(statistics.median(w["step_ms"][k:]) / statistics.median(w["torch"]["step_ms"][k:]))
    return out

if __name__ == "__main__":
    main()
