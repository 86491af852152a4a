"""More third-party architectures from transformers, each built from a small config with random weights (nothing
is downloaded), for the exhaustive coverage sweep (``tests/test_gemm_coverage_zoo.py``). Each builder returns
(model, args, kwargs) for one forward; ``loss_of`` in ``third_party_models`` reduces the output."""
from __future__ import annotations

import torch

VOCAB, SEQ = 64, 16
_D = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB)
_TOKENS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=0)


def _ids(batch=2, seq=SEQ):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def _image(batch=2, size=32):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


def _text(config, model, **kw):
    def build():
        import transformers as T
        cfg = getattr(T, config)(**{**_D, "max_position_embeddings": 64, **_TOKENS, **kw})
        return getattr(T, model)(cfg), (_ids(),), {}
    return build


def _built(config, model, args, kwargs=None, **cfg):
    def build():
        import transformers as T
        a = args()
        return (getattr(T, model)(getattr(T, config)(**cfg)), a if isinstance(a, tuple) else (a,),
                dict(kwargs() if kwargs else {}))
    return build


# Configs switch off what makes two forwards differ (wav2vec2's LayerDrop and time masking), and ConvNeXt's layer
# scale starts at 1 (its 1e-6 default makes unscaled e5m2 gradients underflow, so a step would change few weights).
ZOO = {
    "mistral": _text("MistralConfig", "MistralForCausalLM", num_key_value_heads=2),
    "qwen2": _text("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2),
    "gemma": _text("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=2, head_dim=8),
    "phi": _text("PhiConfig", "PhiForCausalLM"),
    "gpt_neox": _text("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "mixtral": _text("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2, num_local_experts=4,
                     num_experts_per_tok=2),
    "qwen2_moe": _text("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_key_value_heads=2, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "roberta": _text("RobertaConfig", "RobertaForMaskedLM"),
    "deberta_v2": _text("DebertaV2Config", "DebertaV2ForSequenceClassification"),
    "mpnet": _text("MPNetConfig", "MPNetForMaskedLM"),
    "opt": _built("OPTConfig", "OPTForCausalLM", _ids, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64, word_embed_proj_dim=32, **_TOKENS),
    "falcon": _built("FalconConfig", "FalconForCausalLM", _ids, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, vocab_size=VOCAB, **_TOKENS),
    "gptj": _built("GPTJConfig", "GPTJForCausalLM", _ids, n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB,
                   n_positions=64, rotary_dim=4, **_TOKENS),
    "distilbert": _built("DistilBertConfig", "DistilBertForSequenceClassification", _ids, dim=32, n_layers=2,
                         n_heads=4, hidden_dim=64, vocab_size=VOCAB),
    "albert": _built("AlbertConfig", "AlbertForMaskedLM", _ids, embedding_size=16, **_D),
    "electra": _built("ElectraConfig", "ElectraForPreTraining", _ids, embedding_size=16, **_D),
    "mobilebert": _built("MobileBertConfig", "MobileBertForMaskedLM", _ids, hidden_size=32, embedding_size=16,
                         intermediate_size=64, intra_bottleneck_size=16, true_hidden_size=16, num_attention_heads=4,
                         num_hidden_layers=2, vocab_size=VOCAB),
    "xlnet": _built("XLNetConfig", "XLNetLMHeadModel", _ids, d_model=32, n_layer=2, n_head=4, d_inner=64,
                    vocab_size=VOCAB),
    "bart": _built("BartConfig", "BartForConditionalGeneration", _ids, lambda: {"labels": _ids()}, d_model=32,
                   encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                   encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64, **_TOKENS,
                   decoder_start_token_id=0),
    "whisper": _built("WhisperConfig", "WhisperForConditionalGeneration",
                      lambda: (torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0)),),
                      lambda: {"decoder_input_ids": _ids(seq=8)}, d_model=32, encoder_layers=1, decoder_layers=1,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                      vocab_size=VOCAB, num_mel_bins=16, max_source_positions=16, max_target_positions=32, **_TOKENS,
                      decoder_start_token_id=0),
    "wav2vec2": _built("Wav2Vec2Config", "Wav2Vec2ForCTC",
                       lambda: (torch.randn(2, 1600, generator=torch.Generator().manual_seed(0)),),
                       hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       vocab_size=VOCAB, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                       num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, layerdrop=0.0,
                       mask_time_prob=0.0),
    "convnext": _built("ConvNextConfig", "ConvNextForImageClassification", _image, hidden_sizes=[8, 16, 32, 64],
                       depths=[1, 1, 1, 1], num_labels=10, layer_scale_init_value=1.0),
    "swin": _built("SwinConfig", "SwinForImageClassification", _image, image_size=32, patch_size=4, embed_dim=16,
                   depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=10),
    "segformer": _built("SegformerConfig", "SegformerForSemanticSegmentation", _image, num_encoder_blocks=2,
                        depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                        patch_sizes=[7, 3], strides=[4, 2], decoder_hidden_size=32, num_labels=4),
    "mamba": _built("MambaConfig", "MambaForCausalLM", _ids, hidden_size=32, num_hidden_layers=2,
                    vocab_size=VOCAB, state_size=4, expand=2),
    "qwen3": _text("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=8),
    "phi3": _text("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2),
    "gemma2": _text("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=8),
    "stablelm": _text("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2),
    "olmo": _text("OlmoConfig", "OlmoForCausalLM", num_key_value_heads=2),
    "starcoder2": _text("Starcoder2Config", "Starcoder2ForCausalLM", num_key_value_heads=2),
    "codegen": _built("CodeGenConfig", "CodeGenForCausalLM", _ids, n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB,
                      n_positions=64, rotary_dim=4, **_TOKENS),
    "convbert": _built("ConvBertConfig", "ConvBertForMaskedLM", _ids, embedding_size=16, **_D),
    "funnel": _built("FunnelConfig", "FunnelForMaskedLM", _ids, d_model=32, n_head=4, d_head=8, d_inner=64,
                     block_sizes=[1, 1], vocab_size=VOCAB),
    "pegasus": _built("PegasusConfig", "PegasusForConditionalGeneration", _ids, lambda: {"labels": _ids()},
                      d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB,
                      max_position_embeddings=64, **_TOKENS, decoder_start_token_id=0),
    "mt5": _built("MT5Config", "MT5ForConditionalGeneration", _ids, lambda: {"labels": _ids()}, d_model=32, d_ff=64,
                  d_kv=8, num_layers=1, num_heads=4, vocab_size=VOCAB, decoder_start_token_id=0),
    "clip_vision": _built("CLIPVisionConfig", "CLIPVisionModelWithProjection", _image, hidden_size=32,
                          intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                          patch_size=8, projection_dim=16),
    "dinov2": _built("Dinov2Config", "Dinov2ForImageClassification", _image, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, image_size=32, patch_size=8, mlp_ratio=2, num_labels=10),
    "beit": _built("BeitConfig", "BeitForImageClassification", _image, hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8,
                   use_relative_position_bias=True, num_labels=10),
    "hubert": _built("HubertConfig", "HubertForCTC",
                     lambda: (torch.randn(2, 800, generator=torch.Generator().manual_seed(0)),),
                     hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     vocab_size=VOCAB, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, layerdrop=0.0, mask_time_prob=0.0),
    "levit": _built("LevitConfig", "LevitForImageClassification", _image, image_size=32, hidden_sizes=[32, 48, 64],
                    num_attention_heads=[2, 3, 4], depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=10),
    "poolformer": _built("PoolFormerConfig", "PoolFormerForImageClassification", _image, hidden_sizes=[8, 16, 32, 64],
                         depths=[1, 1, 1, 1], num_labels=10),
    # sliding-window attention: its mask is an einsum over an index of size 1 (an element-wise product to torch)
    "longformer": _text("LongformerConfig", "LongformerForMaskedLM", attention_window=4),
    "led": _built("LEDConfig", "LEDForConditionalGeneration", _ids, lambda: {"decoder_input_ids": _ids()}, d_model=32,
                  encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_encoder_position_embeddings=64,
                  max_decoder_position_embeddings=64, attention_window=4, **_TOKENS),
    # attention through F.multi_head_attention_forward called directly, with a gated relative position bias
    "wavlm": _built("WavLMConfig", "WavLMForCTC",
                    lambda: (torch.randn(2, 800, generator=torch.Generator().manual_seed(0)),),
                    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    vocab_size=VOCAB, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
                    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_buckets=16,
                    max_bucket_distance=32, layerdrop=0.0, mask_time_prob=0.0),
    # reversible layers: backward recomputes each layer's attention in its own autograd Function
    "reformer": _built("ReformerConfig", "ReformerModelWithLMHead", _ids, hidden_size=32, num_attention_heads=2,
                       attention_head_size=16, feed_forward_size=64, vocab_size=VOCAB, attn_layers=["local", "lsh"],
                       axial_pos_embds_dim=[16, 16], axial_pos_shape=[4, 4], local_attn_chunk_length=4,
                       lsh_attn_chunk_length=4, num_buckets=2, is_decoder=True, max_position_embeddings=SEQ,
                       pad_token_id=0, eos_token_id=1),
    # patch embedding: Conv2d(padding="valid")
    "siglip_vision": _built("SiglipConfig", "SiglipForImageClassification", _image, num_labels=10,
                            vision_config=dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=64)),
}
