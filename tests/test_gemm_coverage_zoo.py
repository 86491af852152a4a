"""Every GEMM of 148 more transformers architectures runs on the format (exhaustive tier: ``pytest -m exhaustive``):
decoders with GQA, MLA, MoE routing, rotary and ALiBi attention, hybrid state-space and recurrent blocks, encoders
(approximate attention, a custom autograd Function's own backward), encoder-decoders, speech (1-D convolutions),
vision and video (depthwise, grouped and strided convolutions, windowed attention) and state-space models. The
loss is finite unless ``NONFINITE`` names the (model, policy) and why: the model's arithmetic leaving its domain
on the format."""
import copy
import warnings

import pytest
import torch

import emunum
from third_party_models import loss_of
from third_party_zoo import NONFINITE, ZOO

pytestmark = pytest.mark.exhaustive

POLICIES = {"e4m3fn/e5m2": {"fmt": "e4m3fn", "grad": "e5m2"}, "mxfp8": {"fmt": "mxfp8_e4m3"},
            "nvfp4": {"fmt": "nvfp4"}, "nvfp4 on b200_mxf4nvf4": {"fmt": "nvfp4", "mad": "b200_mxf4nvf4_ue4m3"},
            "e4m3fn/e5m2 on h100_fp8_e4m3": {"fmt": "e4m3fn", "grad": "e5m2", "mad": "h100_fp8_e4m3"}}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_gemm_of_the_model_runs_on_the_format_and_a_step_trains(name, policy):
    torch.manual_seed(0)
    model, args, kw = ZOO[name]()
    plain = emunum.coverage(copy.deepcopy(model), *args, loss_fn=_loss, **kw)
    assert plain.fraction == 0.0 and plain.total_flops > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # layers that override forward (named, not silent)
        emunum.patch(model, **POLICIES[policy])
    cov = emunum.coverage(model, *args, loss_fn=_loss, **kw)
    assert cov.fraction == 1.0, str(cov)
    assert cov.total_flops == plain.total_flops  # the same GEMMs, now on the format
    model.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    loss = _loss(model(*args, **kw))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-3).step()
    assert bool(torch.isfinite(loss)) is ((name, policy) not in NONFINITE), NONFINITE.get((name, policy))
    assert sum(not torch.equal(b, p) for b, p in zip(before, model.parameters())) > len(before) // 2


def _loss(out):
    return loss_of(out)
