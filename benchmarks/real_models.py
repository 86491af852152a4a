"""Training-step time of small real architectures, fp32 against an emulation policy, in one process.

    python benchmarks/real_models.py                        # every model, fp32 and the e4m3fn/e5m2 policy
    python benchmarks/real_models.py --policy mad           # ResNet-18 on mad="h100_fp8_e4m3" (32x32, batch 2)
    python benchmarks/real_models.py --policy fp8           # cnn2d and ResNet-18 on the fp8 recipe's MAD unit
    python benchmarks/real_models.py --policy nvfp4         # every model under the NVFP4 recipe's policy
    python benchmarks/real_models.py --models bert,llama --rounds 9 --profile llama
    python benchmarks/real_models.py --models cnn2d,resnet18,bert,llama --compare-elide
    python benchmarks/real_models.py --models cnn2d,resnet18,bert,llama --compare-fused

Models (random weights, built from configs; nothing is downloaded):
- ``cnn2d``: a small 2-D CNN written here, tuned by no benchmark: conv3x3(3->16)-ReLU-conv3x3(16->32)-ReLU-
  maxpool2-Linear(8192->64)-ReLU-Linear(64->10), 32x32 inputs, batch 64 (``--cnn-batch``);
- ``resnet18``: torchvision's ``resnet18`` architecture written out here (torchvision does not import in this
  environment): 7x7/2 stem conv, BN, ReLU(inplace=True), 3x3/2 max-pool, four stages of two BasicBlocks
  (conv3x3-BN-ReLU-conv3x3-BN, ``out += identity``, ReLU(inplace=True); a 1x1/2 conv + BN downsample where the
  shape changes), average pool, fc; full widths 64-512, 10 classes, 32x32 inputs, batch 2;
- ``bert``: transformers ``BertForMaskedLM`` (hidden 128, 2 layers, 2 heads, ffn 512, vocab 1000), seq 64, batch 2;
- ``llama``: transformers ``LlamaForCausalLM`` with SDPA attention (hidden 128, 2 layers, 4 heads, 2 KV heads,
  ffn 352, vocab 1000), seq 64, batch 2;
- ``gpt2``: transformers ``GPT2LMHeadModel`` (its Linear layers are ``Conv1D`` modules, which call
  ``torch.addmm``: ``patch`` emulates them as functional GEMMs), n_embd 128, 2 layers, 2 heads, vocab 1000,
  seq 64, batch 2.
``--width`` scales the transformers: hidden size w (default 128), w/64 heads (BERT, GPT-2), w/32 heads and w/64 KV
heads (Llama), FFN 4w (BERT) or 11w/4 (Llama); with ``--seq``/``--batch`` this shows how the emulation's
per-rounding costs weigh less as the GEMMs grow.

Policies (``--policy``): ``elementwise`` = ``emunum.patch(model, fmt="e4m3fn", grad="e5m2")``; ``mad`` = the same plus
``mad="h100_fp8_e4m3"`` (GEMMs on the emulated H100 FP8 tensor core; run on ResNet-18 only unless ``--models`` says
otherwise); ``fp8`` = ``emunum.patch(model, fmt="fp8_152", mad=MADUnit("fp16_169", "fp16_169", chunk=64))``, the fp8
recipe's unit (Wang et al. 2018: 1-6-9 products and accumulator, chunk 64; cnn2d and ResNet-18 unless ``--models``
says otherwise); ``nvfp4`` = experiments/conf/format/nvfp4.yaml's policy (NVFP4 operands, 16x16 weight tiles,
stochastic gradients, the 16-point Hadamard transform on the weight-gradient GEMM, the first and last weight layers
kept, embeddings excluded; every model). One step = zero_grad, forward, loss, backward, SGD step (lr 1e-3). One torch
and numba thread unless ``--threads``. Each round times ``--steps`` steps of every (model, fp32/policy) pair in turn,
after a warm-up round that compiles the kernels (and runs the patched model's first-forward coverage check); the
figure is the median over rounds of the mean step time, and the ratio is against that model's fp32 median from the
same run. Every step starts from the model's initial weights and buffers, put back untimed before it
(``TrainStep.reset``): without loss scaling some models diverge within a few emulated steps, and a step on NaN weights
is not a training step; a step whose loss is not finite stops the run.
``--compare-elide`` adds the policy with ``elide=False`` (every rounding run; ``docs/elision.md``) to the same
rounds; ``--compare-fused`` turns the one-node-per-layer path on for the policy
(``emunum.nn.fused.set_fused(True)``; it is off by default) and adds the policy with it off (``fused(False)``
around each step). ``--clock cpu`` times this process's CPU time instead of wall time (steadier on a shared
machine). Only public API is used (``emunum.patch``), so the script measures whatever the patch emulates today.
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch
from torch import nn

POLICIES = {
    "elementwise": dict(fmt="e4m3fn", grad="e5m2"),
    "mad": dict(fmt="e4m3fn", grad="e5m2", mad="h100_fp8_e4m3"),
    "fp8": dict(fmt="fp8_152", mad=None),  # mad: the fp8 recipe's MADUnit, made in main (emunum imported there)
    # experiments/conf/format/nvfp4.yaml's policy (the NVFP4 pre-training recipe; its `exclude: [Embedding]`)
    "nvfp4": dict(fmt="nvfp4", weight="nvfp4_2d", grad_rounding="stochastic", keep_first_last=True, hadamard=16,
                  filter=lambda module, name: not isinstance(module, nn.Embedding)),
}
DEFAULT_MODELS = {"elementwise": "cnn2d,resnet18,bert,llama,gpt2", "mad": "resnet18", "fp8": "cnn2d,resnet18",
                  "nvfp4": "cnn2d,resnet18,bert,llama,gpt2"}
MODELS = ("cnn2d", "resnet18", "bert", "llama", "gpt2")


# ----------------------------------------------------------------------------------------------- models
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's layers, in its order and with its names."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 1)
        self.layer2 = self._make_layer(128, 2)
        self.layer3 = self._make_layer(256, 2)
        self.layer4 = self._make_layer(512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes: int, stride: int) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, down)]
        self.inplanes = planes
        layers.append(BasicBlock(planes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def cnn2d() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))


def build(name: str, batch: int, seq: int, image: int, cnn_batch: int = 64, width: int = 128):
    """(model, make_loss, description) with make_loss(model) -> scalar loss on a fixed random batch; width: the
    transformers' hidden size (a multiple of 64; the module doc's configs are width 128)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "cnn2d":
        x = torch.randn(cnn_batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (cnn_batch,), generator=g)
        return cnn2d(), lambda m: nn.functional.cross_entropy(m(x), y), f"32x32, batch {cnn_batch}"
    if name == "resnet18":
        model = ResNet18()
        x = torch.randn(batch, 3, image, image, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        return model, lambda m: nn.functional.cross_entropy(m(x), y), f"{image}x{image}, batch {batch}"
    import transformers as tf

    vocab = 1000
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if name == "bert":
        cfg = tf.BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=2,
                            num_attention_heads=width // 64, intermediate_size=4 * width,
                            max_position_embeddings=seq, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = tf.BertForMaskedLM(cfg)
    elif name == "llama":
        cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=2,
                             num_attention_heads=width // 32, num_key_value_heads=width // 64,
                             intermediate_size=width * 11 // 4, max_position_embeddings=seq)
        cfg._attn_implementation = "sdpa"
        model = tf.LlamaForCausalLM(cfg)
    elif name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=width, n_layer=2, n_head=width // 64, n_positions=seq,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"model {name!r}")
    if name == "llama" and model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"llama built with attention {model.config._attn_implementation!r}, wanted 'sdpa'")
    shape = f"seq {seq}, batch {batch}" + ("" if width == 128 else f", width {width}")
    return model, (lambda m: m(input_ids=ids, labels=ids).loss), shape


class TrainStep:
    """One training step of a model: zero_grad, forward, loss, backward, SGD step (lr 1e-3); returns the detached
    loss. ``reset()`` puts the model's parameters and buffers back to their values when the step was made: the
    timing loops call it (untimed) before every timed step, so that every step times a model with finite weights.
    Without loss scaling, the emulated formats overflow within a few steps on some of these models (ResNet-18 at
    batch 2: the fp8 policy's weight gradients at its third step, e4m3fn's conv outputs at its seventh), and a step
    on non-finite weights takes other paths (NaN operands) at another speed."""

    def __init__(self, model: nn.Module, make_loss):
        self.model, self.make_loss = model, make_loss
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        self._saved = [(t, t.detach().clone()) for t in itertools.chain(model.parameters(), model.buffers())]

    def __call__(self) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = self.make_loss(self.model)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def reset(self) -> None:
        with torch.no_grad():
            for t, v in self._saved:
                t.copy_(v)


class _Unfused:
    """A ``TrainStep`` run with the fused GEMM node off (``fused(False)``)."""

    def __init__(self, step: TrainStep):
        self.step = step
        self.reset = step.reset

    def __call__(self) -> torch.Tensor:
        from emunum.nn.fused import fused

        with fused(False):
            return self.step()


def time_steps(run, steps: int, clock, check: bool = True) -> float:
    """Mean seconds per step of ``steps`` steps of ``run``, each from the state ``run.reset()`` restores (not
    timed). With ``check``, raises where a step's loss is not finite: the figure would time NaN paths, not
    training."""
    total = 0.0
    for _ in range(steps):
        run.reset()
        t0 = clock()
        loss = run()
        total += clock() - t0
        if check and not bool(torch.isfinite(loss)):
            raise RuntimeError(f"a timed step's loss is {loss.item()} (from the model's initial weights): the "
                               "step time of a diverged model is not a training step's")
    return total / steps


# ------------------------------------------------------------------------------------------------- main
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="elementwise", choices=sorted(POLICIES))
    p.add_argument("--models", default=None, help="comma-separated subset of cnn2d,resnet18,bert,llama,gpt2 "
                   "(default: all for elementwise, resnet18 for mad, cnn2d and resnet18 for fp8)")
    p.add_argument("--steps", type=int, default=None, help="steps per pair per round (default 10; mad, fp8 1)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7; mad, fp8 3)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--cnn-batch", type=int, default=64)
    p.add_argument("--width", type=int, default=128,
                   help="the transformers' hidden size, a multiple of 64 (heads, KV heads and FFN widths scale with "
                   "it; module doc)")
    p.add_argument("--compare-elide", action="store_true",
                   help="also time the policy with elide=False (every rounding run), interleaved")
    p.add_argument("--compare-fused", action="store_true",
                   help="time the policy with the fused GEMM node on (off by default) and, interleaved, off")
    p.add_argument("--layers-only", action="store_true",
                   help="also time the policy with functional=False (swapped layers only, no functional GEMMs)")
    p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                   help="wall: time.perf_counter; cpu: this process's CPU time (time.process_time), which other "
                   "processes on a shared machine disturb less (with one thread it is the step's own work)")
    p.add_argument("--profile", default=None, metavar="MODEL",
                   help="after timing, cProfile 5 steps of MODEL under the policy and print the top functions")
    a = p.parse_args(argv)
    mad = a.policy in ("mad", "fp8")
    steps = a.steps if a.steps is not None else (1 if mad else 10)
    rounds = a.rounds if a.rounds is not None else (3 if mad else 7)
    for k, v in (("steps", steps), ("rounds", rounds), ("threads", a.threads), ("batch", a.batch),
                 ("seq", a.seq), ("image", a.image), ("cnn-batch", a.cnn_batch)):
        if v < 1:
            p.error(f"--{k}={v} must be >= 1")
    if a.width < 64 or a.width % 64:
        p.error(f"--width={a.width} must be a positive multiple of 64")
    names = [n.strip() for n in (a.models or DEFAULT_MODELS[a.policy]).split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        p.error(f"--models: unknown {bad}; allowed: {', '.join(MODELS)}")

    import emunum
    from emunum import buffers, torch_cpu

    torch_cpu.set_threads(a.threads)
    retained = buffers.retain_freed_memory()
    print(f"# torch {torch.__version__}, threads {a.threads}, malloc "
          f"{'retain_freed_memory()' if retained else 'glibc default'}, load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    policy = dict(POLICIES[a.policy])
    if a.policy == "fp8":  # Wang et al.'s unit, as experiments/conf/format/fp8.yaml: 1-6-9 products and sums, chunk 64
        from emunum import MADUnit

        policy["mad"] = MADUnit("fp16_169", "fp16_169", chunk=64)
    print(f"# policy {a.policy}: emunum.patch(model, " + ", ".join(f"{k}={v!r}" for k, v in policy.items()) + ")")

    if a.compare_fused:
        from emunum.nn.fused import set_fused

        set_fused(True)
    runs = {}
    for n in names:
        m32, loss32, desc = build(n, a.batch, a.seq, a.image, a.cnn_batch, a.width)
        me, losse, _ = build(n, a.batch, a.seq, a.image, a.cnn_batch, a.width)
        emunum.patch(me, **policy)
        runs[(n, "fp32")] = TrainStep(m32, loss32)
        runs[(n, a.policy)] = TrainStep(me, losse)
        runs[(n, "desc")] = desc
        if a.compare_elide:
            mo, losso, _ = build(n, a.batch, a.seq, a.image, a.cnn_batch, a.width)
            emunum.patch(mo, elide=False, **policy)
            runs[(n, "elide-off")] = TrainStep(mo, losso)
        if a.compare_fused:
            mf, lossf, _ = build(n, a.batch, a.seq, a.image, a.cnn_batch, a.width)
            emunum.patch(mf, **policy)
            runs[(n, "fused-off")] = _Unfused(TrainStep(mf, lossf))
        if a.layers_only:
            ml, lossl, _ = build(n, a.batch, a.seq, a.image, a.cnn_batch, a.width)
            emunum.patch(ml, functional=False, **policy)
            runs[(n, "layers-only")] = TrainStep(ml, lossl)
    configs = (("fp32", a.policy) + (("elide-off",) if a.compare_elide else ())
               + (("fused-off",) if a.compare_fused else ())
               + (("layers-only",) if a.layers_only else ()))
    pairs = [(n, k) for n in names for k in configs]
    t_warm = time.perf_counter()
    for key in pairs:  # warm-up: compile kernels, allocate
        time_steps(runs[key], 2 if mad and key[1] != "fp32" else 3, time.perf_counter)
    t_warm = time.perf_counter() - t_warm
    times = {key: [] for key in pairs}
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    for _ in range(rounds):
        for key in pairs:
            times[key].append(time_steps(runs[key], steps, clock))
    print(f"# {steps} steps x {rounds} rounds, interleaved, {a.clock} clock; warm-up {t_warm:.1f} s")
    w = max(20, *(len(runs[(n, "desc")]) for n in names))
    print(f"{'model':<9} {'shape':<{w}} {'config':<12} {'ms/step (median)':>17} {'min':>9} {'max':>9} {'x fp32':>7}")
    for n in names:
        base = statistics.median(times[(n, "fp32")])
        for k in configs:
            v = times[(n, k)]
            med = statistics.median(v)
            print(f"{n:<9} {runs[(n, 'desc')]:<{w}} {k:<12} {1e3 * med:17.2f} {1e3 * min(v):9.2f} "
                  f"{1e3 * max(v):9.2f} {med / base:7.2f}")
    print("# load average at the end " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    if a.profile:
        import cProfile
        import pstats

        key = (a.profile, a.policy)
        if key not in runs:
            p.error(f"--profile {a.profile}: not among --models")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            runs[key].reset()
            runs[key]()
        pr.disable()
        pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
