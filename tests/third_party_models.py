"""Small third-party models built from their configs with random weights (nothing is downloaded): transformers'
GPT-2, Llama (SDPA attention), BERT, T5, BLOOM (keyword ``torch.baddbmm`` calls), ViT and ResNet (torchvision's wheel does not import on the CPU torch,
so the vision models are transformers' own). Each builder returns (model, args, kwargs) for one forward."""
from __future__ import annotations

import torch

VOCAB, SEQ = 64, 16


def _ids(seed=0, batch=2):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def _image(batch=2, size=32):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


def gpt2():
    import transformers as T
    cfg = T.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
                       eos_token_id=0)
    return T.GPT2LMHeadModel(cfg), (_ids(),), {}


def llama():
    import transformers as T
    cfg = T.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0,
                        eos_token_id=0, attn_implementation="sdpa")
    return T.LlamaForCausalLM(cfg), (_ids(),), {}


def bert():
    import transformers as T
    cfg = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                       vocab_size=VOCAB, max_position_embeddings=32)
    return T.BertForSequenceClassification(cfg), (_ids(),), {}


def t5():
    import transformers as T
    cfg = T.T5Config(d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2, vocab_size=VOCAB,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    ids = _ids()
    return T.T5ForConditionalGeneration(cfg), (ids,), {"labels": ids}


def bloom():
    import transformers as T
    cfg = T.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0,
                        pad_token_id=0)
    return T.BloomForCausalLM(cfg), (_ids(),), {}


def vit():
    import transformers as T
    cfg = T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      image_size=32, patch_size=8, num_labels=10)
    return T.ViTForImageClassification(cfg), (_image(),), {}


def resnet():
    import transformers as T
    cfg = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic",
                         num_labels=10)
    return T.ResNetForImageClassification(cfg), (_image(),), {}


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5, "bloom": bloom, "vit": vit, "resnet": resnet}


def training_case(name: str):
    """(build, loss): ``build()`` makes model ``name`` afresh from seed 0 in train mode; ``loss(model)`` runs
    it on its fixed inputs and reduces the output with ``loss_of``."""
    _, args, kwargs = MODELS[name]()

    def build():
        torch.manual_seed(0)
        return MODELS[name]()[0].train()

    return build, lambda m: loss_of(m(*args, **kwargs))


def loss_of(out) -> torch.Tensor:
    """A scalar that depends on every output: the model's own loss when it has one, plus its logits' (or, without
    logits, its first output's) mean square."""
    logits = out.logits if hasattr(out, "logits") else out if isinstance(out, torch.Tensor) else out[0]
    loss = logits.float().square().mean()
    return loss + out.loss if getattr(out, "loss", None) is not None else loss
