"""The language-model workload: byte corpora (stdlib, a user's file), the causal ByteLM, bits per byte."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

import emunum
from experiments import data as data_mod
from experiments import tasks
from experiments.lm import ByteLM
from experiments.loop import RESULT_KEYS, train
from experiments.text_data import STDLIB_EXCLUDED, file_corpus, stdlib_corpus, windows

# a tiny model on a small slice of the corpus: a few steps take about a second
TINY = ["experiment=lm", "data=stdlib", "data.max_bytes=20000", "model.d_model=16", "model.heads=2",
        "model.layers=1", "batch_size=4", "max_iters=3", "eval_every=3"]


def _results(run_dir) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def _scalar_tags(run_dir) -> set:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return set(acc.Tags()["scalars"])


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp8"])
def test_lm_trains_a_few_steps_through_hydra_and_records_bits_per_byte_and_digest(compose, tmp_path, fmt):
    cfg = compose(*TINY, f"format={fmt}")
    assert cfg.model.name == "lm" and cfg.data.name == "stdlib" and cfg.target_loss == cfg.data.target_loss
    res = train(cfg, tmp_path)
    data = _results(tmp_path)
    assert list(data)[: len(RESULT_KEYS)] == list(RESULT_KEYS)
    assert data["status"] == "not_reached" and data["iterations_run"] == 3 and data["format"] == fmt
    assert data["target_accuracy"] is None and data["best_accuracy"] is None
    assert data["target_loss"] == cfg.data.target_loss
    # an untrained byte model is near the uniform loss ln 256 = 5.55 nats
    assert 3.0 < data["final_loss"] < 6.5
    assert data["final_bits_per_byte"] == data["final_loss"] / math.log(2.0)
    assert data["best_bits_per_byte"] == data["best_loss"] / math.log(2.0)
    assert data["data_sha256"] == stdlib_corpus(20000).sha256 == res.data_sha256
    assert {"val/loss", "val/bits_per_byte", "train/bits_per_byte"} <= _scalar_tags(tmp_path)


def test_stdlib_corpus_is_deterministic_and_its_digest_is_the_sha256_of_its_bytes():
    a, b = stdlib_corpus(50000), stdlib_corpus(50000)
    assert a == b
    assert a.sha256 == hashlib.sha256(a.text).hexdigest() and len(a.text) == 50000
    assert len(a.files) > 1 and len(set(a.files)) == len(a.files)
    assert not any(set(f.split("/")[:-1]) & STDLIB_EXCLUDED for f in a.files)
    assert a.text.startswith(f"# file: {a.files[0]}\n".encode())
    # a larger corpus is another selection, with another digest
    assert stdlib_corpus(60000).sha256 != a.sha256


def test_stdlib_stride_spreads_a_small_corpus_over_the_whole_library():
    small, whole = stdlib_corpus(200000), stdlib_corpus(None)
    assert len(whole.files) > 10 * len(small.files)
    # the chosen files are every k-th of the full sorted list, from the first (then from the second, ...)
    k = whole.files.index(small.files[1])
    order = [f for start in range(k) for f in whole.files[start::k]]
    assert k > 1 and list(small.files) == order[: len(small.files)]
    assert len(small.text) == 200000 and len(whole.text) == sum(len(f"# file: {f}\n") for f in whole.files) + \
        sum((Path(whole.source.split(":", 1)[1]) / f).stat().st_size for f in whole.files)


def test_windows_are_the_text_and_the_targets_are_the_next_bytes():
    text = bytes(range(256)) * 3 + b"tail"
    x, y = windows(text, 10)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == ((len(text) - 1) // 10, 10)
    assert bytes(x.flatten().tolist()) == text[: x.numel()]
    assert bytes(y.flatten().tolist()) == text[1: x.numel() + 1]


def test_text_data_trains_on_a_users_file(compose, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(("the quick brown fox jumps over the lazy dog. " * 200).encode())
    cfg = compose(*TINY, "data=text", f"data.path={path}", "target_loss=3.0")
    ds = data_mod.load(cfg.data)
    assert ds.task == "language_model" and ds.num_outputs == 256 and ds.input_shape == (64,)
    assert ds.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(ds.x_val) == (len(path.read_bytes()) // 10 - 1) // 64  # the last 10%
    res = train(cfg, tmp_path / "run")
    assert res.iterations_run == 3 and _results(tmp_path / "run")["data_sha256"] == ds.sha256


def test_bad_data_path_fails_naming_the_field(compose, tmp_path):
    with pytest.raises(ValueError, match=r"data.path=.*nowhere.* does not exist; allowed: a readable text file"):
        train(compose(*TINY, "data=text", f"data.path={tmp_path / 'nowhere'}", "target_loss=1"), tmp_path / "r")
    with pytest.raises(ValueError, match=r"data.path=.* is a directory"):
        train(compose(*TINY, "data=text", f"data.path={tmp_path}", "target_loss=1"), tmp_path / "r")
    with pytest.raises(ValueError, match=r"data.path is not set"):
        train(compose(*TINY, "data=text", "target_loss=1"), tmp_path / "r")
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match=r"data.path=.*short.txt.*validation split has 10 bytes.*data.context"):
        train(compose(*TINY, "data=text", f"data.path={short}", "target_loss=1"), tmp_path / "r")
    assert not (tmp_path / "r" / "results.json").exists()  # train() itself writes no failure record


def test_file_corpus_reads_at_most_max_bytes(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"abcdef" * 10)
    c = file_corpus(str(path), 7)
    assert c.text == b"abcdefa" and c.sha256 == hashlib.sha256(b"abcdefa").hexdigest()


@pytest.mark.parametrize("override,field", [("data.context=0", "data.context"), ("data.max_bytes=0", "data.max_bytes"),
                                            ("data.val_fraction=1.0", "data.val_fraction"),
                                            ("model.heads=3", "model.heads")])
def test_out_of_range_lm_values_raise_naming_the_field(compose, tmp_path, override, field):
    with pytest.raises(ValueError, match=field):
        train(compose(*TINY, override), tmp_path)


def test_text_without_a_target_loss_asks_for_one(compose, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello world " * 100)
    with pytest.raises(ValueError, match="set target_loss .*nats per byte"):
        train(compose(*TINY, "data=text", f"data.path={path}"), tmp_path / "r")


def test_lm_and_signal_models_refuse_the_other_kind_of_data(compose, tmp_path):
    with pytest.raises(ValueError, match="model=lm needs token data"):
        train(compose("model=lm", "data=digits", "max_iters=1"), tmp_path / "a")
    with pytest.raises(ValueError, match=r"model=mlp needs \(channels, length\) inputs; got \(64,\) "
                                         r"\(token data goes with model=lm\)"):
        train(compose(*[o for o in TINY if not o.startswith("model.")], "model=mlp"), tmp_path / "b")


@pytest.mark.parametrize("fmt", [None, "bf16", "fp8_152"])
def test_lm_is_causal_no_position_sees_a_later_token(fmt):
    torch.manual_seed(0)
    model = ByteLM(256, 16, d_model=16, heads=2, layers=2, mlp_ratio=2).eval()
    if fmt is not None:
        model = emunum.patch(model, fmt=fmt)
    x = torch.randint(0, 256, (3, 16))
    x2 = x.clone()
    x2[:, 9:] = torch.randint(0, 256, (3, 7))
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert a.shape == (3, 16, 256)
    assert torch.equal(a[:, :9], b[:, :9])  # bit-identical before the change
    assert not torch.equal(a[:, 9:], b[:, 9:])


def test_patch_emulates_every_layer_of_the_lm():
    model = emunum.patch(ByteLM(256, 8, d_model=16, heads=2, layers=1), fmt="bf16")
    kinds = {type(m).__name__ for name, m in model.named_modules() if name and not name.endswith("out_proj")
             and type(m).__module__.startswith("torch.nn")}
    assert kinds <= {"ModuleList", "Sequential", "DecoderBlock"}, kinds  # nothing left unemulated
    names = {type(m).__name__ for m in model.modules()}
    assert {"EmuEmbedding", "EmuLinear", "EmuLayerNorm", "EmuMultiheadAttention", "EmuGELU"} <= names


def test_bits_per_byte_is_the_loss_in_bits_and_only_for_language_models():
    assert tasks.bits_per_byte("language_model", 3 * math.log(2.0)) == pytest.approx(3.0, rel=1e-15)
    assert tasks.bits_per_byte("classification", 1.0) is None
    assert tasks.bits_per_byte("language_model", float("nan")) is None
    with pytest.raises(ValueError, match="task='lm' is not a task; allowed: classification"):
        tasks.loss_fn("lm")
    logits, y = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    assert torch.equal(tasks.loss_fn("language_model")(logits, y),
                       torch.nn.functional.cross_entropy(logits.transpose(1, 2), y))


@pytest.mark.parametrize("fmt", ["fp32", "fp8"])
def test_lm_resumed_after_a_kill_ends_bit_identical_to_the_uninterrupted_run(compose, tmp_path, fmt):
    common = [*TINY, f"format={fmt}", "max_iters=6", "eval_every=2", "checkpoint_every=2", "seed=5"]
    train(compose(*common), tmp_path / "full")
    part = train(compose(*common, "stop_after=5"), tmp_path / "killed")
    assert part.status == "interrupted" and not (tmp_path / "killed" / "results.json").exists()
    train(compose(*common, "resume=true"), tmp_path / "killed")
    a, b = _results(tmp_path / "full"), _results(tmp_path / "killed")
    assert {k: v for k, v in a.items() if k != "seconds_per_iteration"} == \
        {k: v for k, v in b.items() if k != "seconds_per_iteration"}
    sa, sb = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in ("full", "killed"))
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])


def test_block_recipes_on_the_lm_model_train_with_or_without_excluding_embeddings(compose, tmp_path):
    res = train(compose(*TINY, "format=nvfp4"), tmp_path / "nvfp4")  # exclude: [Embedding]
    assert res.iterations_run == 3
    res = train(compose(*TINY, "format=mxfp8"), tmp_path / "mxfp8")  # the lookup is left unrounded
    assert res.iterations_run == 3
    res = train(compose(*TINY, "format=mxfp8", "+format.policy.exclude=[Embedding]"), tmp_path / "mxfp8x")
    assert res.iterations_run == 3
    with pytest.raises(ValueError, match=r"format.policy.exclude: 'Embeding' is not a torch.nn layer"):
        train(compose(*TINY, "format=mxfp8", "+format.policy.exclude=[Embeding]"), tmp_path / "bad")
