"""Block formats under torch.compile: graph breaks and the compiled training step beside the eager one.

A tiny BERT (transformers' BertForSequenceClassification, hidden 32, 2 layers, 2 heads, eager attention)
patched with a block format (every Linear's GEMMs block-quantised; embeddings and norms left alone, ``emunum.nn.block_gemm``); one step is
forward + backward of the classification loss on a batch of 8 sequences of 32 tokens. Prints, per format, the
graph breaks that ``torch._dynamo.explain`` counts in the model's forward and the median step time of eager and
``torch.compile`` (after warm-up), measured in the same run, their steps interleaved.

    python benchmarks/block_compile.py [--formats mxfp8_e4m3 nvfp4] [--reps 20]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, attn_implementation="eager")
    return BertForSequenceClassification(cfg)


def make(fmt: str):
    import emunum

    torch.manual_seed(0)
    model = emunum.patch(tiny_bert(), fmt, filter=lambda m, name: isinstance(m, torch.nn.Linear))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (8, 32), generator=g)
    labels = torch.randint(0, 2, (8,), generator=g)
    return model, ids, labels


def step(model, ids, labels):
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out.loss.detach()


def graph_breaks(fmt: str) -> int:
    """Graph breaks in the model's forward (its backward is the compiled forward's AOT-autograd graph)."""
    model, ids, labels = make(fmt)
    torch._dynamo.reset()
    return torch._dynamo.explain(model)(input_ids=ids, labels=labels).graph_break_count


def timed(fns, reps: int) -> list:
    """Median seconds per call of each of ``fns``, their calls interleaved (a loaded machine slows them alike)."""
    for fn in fns:
        for _ in range(3):
            fn()
    ts = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, ts):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="+", default=["mxfp8_e4m3", "nvfp4"])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    print(f"{'format':<12} {'graph breaks':>12} {'eager ms':>9} {'compiled ms':>12} {'compiled/eager':>15}")
    for fmt in args.formats:
        breaks = graph_breaks(fmt)
        model, ids, labels = make(fmt)
        torch._dynamo.reset()
        cmodel = torch.compile(model)  # shares the parameters: both steps accumulate into the same .grad
        eager, compiled = timed([lambda: step(model, ids, labels), lambda: step(cmodel, ids, labels)], args.reps)
        print(f"{fmt:<12} {breaks:>12} {eager * 1e3:>9.2f} {compiled * 1e3:>12.2f} {compiled / eager:>15.2f}")


if __name__ == "__main__":
    main()
