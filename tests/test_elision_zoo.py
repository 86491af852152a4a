"""Elision changes no bit on the architectures of the exhaustive zoo whose training is reproducible (exhaustive
tier: ``pytest -m exhaustive``): two training steps give the same losses, gradients, weights and generator state
with elision on and off, under a nearest and a stochastic-forward policy."""
import pytest
import torch

from test_elision import POLICIES, _check_same, _elide_every_size, _train  # noqa: F401  (autouse)
from third_party_models import loss_of
from third_party_zoo import ZOO

pytestmark = pytest.mark.exhaustive

# models whose training step is not reproducible run to run, so two runs cannot be compared bit for bit
UNREPRODUCIBLE = {"reformer": "each layer's training forward reseeds torch's generator from the OS (torch.seed())"}


@pytest.mark.parametrize("policy", ["e4m3fn_e5m2", "directed_sr_forward"])
@pytest.mark.parametrize("name", sorted(set(ZOO) - set(UNREPRODUCIBLE)))
def test_the_model_gives_the_same_bits_with_elision_on_and_off(name, policy):
    _, args, kwargs = ZOO[name]()

    def build():
        torch.manual_seed(0)
        return ZOO[name]()[0].train()

    def loss(m):
        return loss_of(m(*args, **kwargs))

    on = _train(build, loss, True, POLICIES[policy], steps=2)
    off = _train(build, loss, False, POLICIES[policy], steps=2)
    _check_same(on, off)
