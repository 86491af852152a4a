"""emunum.Policy: the keyword form's defaults and overrides, parsing once at the edge, and clear errors."""
import dataclasses
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import emunum
from emunum.autograd import STE
from emunum.policy import FORWARD_ROLES, GRADIENT_ROLES, ApproxSpec, Policy, Role, RoleSpec, Scaling, make_policy
from emunum.formats import RoundMode
from emunum.formats.log import LogFormat

E5M2, E4M3FN, INT8 = (emunum.get_format(n) for n in ("e5m2", "e4m3fn", "int8"))


@pytest.mark.parametrize("name", ["e5m2", "fp8_152", "e4m3fn", "int8", "fixed16_12", "bf16"])
def test_fmt_sets_every_role_nearest_forward_stochastic_backward(name):
    p = Policy.make(name)
    fmt = emunum.get_format(name)
    for role in FORWARD_ROLES:
        assert p.spec(role) == RoleSpec(fmt, RoundMode.NEAREST)
    for role in GRADIENT_ROLES:
        assert p.spec(role) == RoleSpec(fmt, RoundMode.STOCHASTIC)


def test_grad_sets_the_gradient_roles_and_role_keywords_override_both():
    p = Policy.make("e4m3fn", grad="e5m2", weight="int8", grad_input=None, output=("e5m2", "toward_zero"))
    assert p.weight == RoleSpec(INT8, "nearest")
    assert p.input == RoleSpec(E4M3FN, "nearest")
    assert p.output == RoleSpec(E5M2, RoundMode.TOWARD_ZERO)
    assert p.grad_weight == p.grad_output == RoleSpec(E5M2, "stochastic")
    assert p.grad_input is None


def test_rounding_keywords_apply_to_their_direction():
    p = Policy.make("e5m2", rounding="rtz", grad_rounding="nearest")
    assert {p.spec(r).rounding for r in FORWARD_ROLES} == {RoundMode.TOWARD_ZERO}
    assert {p.spec(r).rounding for r in GRADIENT_ROLES} == {RoundMode.NEAREST}


def test_grad_none_leaves_gradients_unrounded():
    p = Policy.make("e5m2", grad=None)
    assert all(p.spec(r) is None for r in GRADIENT_ROLES)
    assert all(p.spec(r) is not None for r in FORWARD_ROLES)


def test_constructor_coerces_role_values_once():
    p = Policy(weight="e5m2", grad_weight="e5m2", ste="clipped")
    assert p.weight == RoleSpec(E5M2, RoundMode.NEAREST)
    assert p.grad_weight == RoleSpec(E5M2, RoundMode.STOCHASTIC)
    assert p.input is None and p.ste is STE.CLIPPED


def test_policy_is_frozen_hashable_and_compared_by_value():
    a, b = Policy.make("e5m2", keep_first_last=True), Policy.make("fp8_152", keep_first_last=True)
    assert a == b and hash(a) == hash(b)
    assert a != Policy.make("e5m2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.weight = None


def test_approx_method_names_are_compared_by_value():
    a = Policy.make("e5m2", approx={"tanh": "pwl"})
    b = Policy.make("e5m2", approx={nn.Tanh: {"method": "pwl"}})
    assert a == b
    assert a.approx == ((nn.Tanh, ApproxSpec("tanh", (("method", "pwl"),))),)


@pytest.mark.parametrize("value", ["input", "INPUT", " grad_output ", Role.WEIGHT])
def test_role_parse_accepts_names_and_members(value):
    assert isinstance(Role.parse(value), Role)


def test_role_gradient_pairs():
    assert [r.gradient for r in FORWARD_ROLES] == list(GRADIENT_ROLES)
    assert all(r.is_gradient for r in GRADIENT_ROLES) and not any(r.is_gradient for r in FORWARD_ROLES)


def test_unknown_role_names_the_value_and_the_allowed_roles():
    with pytest.raises(ValueError, match=r"role='activation'.*allowed: weight, input, output"):
        Role.parse("activation")
    with pytest.raises(ValueError, match="'activation'"):
        Policy.make("e5m2").spec("activation")


def test_unknown_format_names_the_role_and_the_value():
    with pytest.raises(ValueError, match=r"weight='float7'.*not a known format"):
        Policy.make("e5m2", weight="float7")
    with pytest.raises(ValueError, match=r"fmt='fp7'.*not a known format"):
        Policy.make("fp7")
    with pytest.raises(TypeError, match=r"grad=3.*must be a FloatFormat"):
        Policy.make("e5m2", grad=3)


def test_bad_rounding_names_the_field():
    with pytest.raises(ValueError, match=r"grad_rounding='sideways'.*allowed: nearest"):
        Policy.make("e5m2", grad_rounding="sideways")
    with pytest.raises(ValueError, match=r"output=\('e5m2', 'sideways'\)"):
        Policy.make("e5m2", output=("e5m2", "sideways"))


def test_bad_role_value_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"input=3.*expected a format"):
        Policy.make("e5m2", input=3)
    with pytest.raises(ValueError, match=r"input=.*2 or 3 items, got 4"):
        Policy.make("e5m2", input=("e5m2", "nearest", "per_tensor", "extra"))
    with pytest.raises(ValueError, match=r"input=\('e5m2', 'nearest', 'extra'\).*scaling='extra'.*allowed: "
                                         r"none, per_tensor"):
        Policy.make("e5m2", input=("e5m2", "nearest", "extra"))


def test_unknown_keyword_is_a_type_error_listing_the_options():
    with pytest.raises(TypeError, match=r"'weights'.*allowed: .*weight"):
        Policy.make("e5m2", weights="int8")


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(filter=3), TypeError, "filter must be callable"),
    (dict(keep_first_last="yes"), TypeError, "keep_first_last must be a bool"),
    (dict(sr_bits=0), ValueError, "sr_bits=0"),
    (dict(ste="sigmoid"), ValueError, "ste='sigmoid'"),
    (dict(approx={"relu": "pwl"}), ValueError, "approx key 'relu'"),
    (dict(approx={nn.ReLU: "pwl"}), ValueError, r"approx\[ReLU\]='pwl'"),
    (dict(approx={nn.Tanh: 3}), TypeError, r"approx\[Tanh\]=3"),
    (dict(approx={3: "pwl"}), TypeError, "approx key 3"),
    (dict(approx=["tanh"]), TypeError, "approx must be a dict"),
    (dict(mad="fp32"), ValueError, "mad='fp32': unknown MAD unit preset"),
    (dict(mad=3), TypeError, "mad must be an emunum.mad.MADUnit"),
    (dict(mad="h100_wgmma_e4m3"), ValueError, "mad='h100_wgmma_e4m3' is a matrix instruction.*allowed with element"),
    (dict(mad="b200_mxf8f6f4_e4m3"), ValueError, "mad='b200_mxf8f6f4_e4m3' is a matrix instruction.*block formats"),
])
def test_bad_options_raise_naming_the_field(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Policy.make("e5m2", **kwargs)


def test_make_policy_takes_a_policy_once():
    p = Policy.make("e5m2")
    assert make_policy(p) is p and make_policy(policy=p) is p
    with pytest.raises(TypeError, match="ambiguous"):
        make_policy(policy=p, weight="int8")
    with pytest.raises(TypeError, match="not both"):
        make_policy(p, policy=p)
    with pytest.raises(TypeError, match="must be an emunum.Policy"):
        make_policy(policy="e5m2")


def test_describe_groups_roles_with_one_spec():
    p = Policy.make("e5m2", weight="int8", grad=None)
    assert p.describe() == ("weight=fixed8_0/nearest, input|output=e5m2/nearest, "
                            "grad_weight|grad_input|grad_output=-")


# ---- per-tensor scaling -------------------------------------------------------------------------------------
def test_roles_are_unscaled_by_default():
    p = Policy.make("e4m3fn")
    assert {p.spec(r).scaling for r in Role} == {Scaling.NONE}
    assert RoleSpec("e4m3fn").scaling is Scaling.NONE


def test_scaling_keyword_scales_every_role_and_grad_scaling_the_gradient_roles():
    p = Policy.make("e4m3fn", scaling="per_tensor")
    assert {p.spec(r).scaling for r in Role} == {Scaling.PER_TENSOR}
    p = Policy.make("e4m3fn", grad="e5m2", scaling="per_tensor", grad_scaling="none")
    assert {p.spec(r).scaling for r in FORWARD_ROLES} == {Scaling.PER_TENSOR}
    assert {p.spec(r).scaling for r in GRADIENT_ROLES} == {Scaling.NONE}
    p = Policy.make("e5m2", grad="e4m3fn", grad_scaling=Scaling.PER_TENSOR)
    assert {p.spec(r).scaling for r in FORWARD_ROLES} == {Scaling.NONE}
    assert {p.spec(r).scaling for r in GRADIENT_ROLES} == {Scaling.PER_TENSOR}


def test_role_keywords_take_their_directions_scaling_unless_a_triple_says_otherwise():
    p = Policy.make("e4m3fn", scaling="per_tensor", weight="int8", output=("e5m2", "nearest"),
                    input=("e4m3fn", "toward_zero", "none"), grad_input=("e5m2", "stochastic", "per_tensor"),
                    grad_scaling="none")
    assert p.weight == RoleSpec(INT8, "nearest", "per_tensor")
    assert p.output == RoleSpec(E5M2, "nearest", Scaling.PER_TENSOR)
    assert p.input == RoleSpec(E4M3FN, RoundMode.TOWARD_ZERO, Scaling.NONE)
    assert p.grad_input == RoleSpec(E5M2, RoundMode.STOCHASTIC, Scaling.PER_TENSOR)
    assert p.grad_weight == RoleSpec(E4M3FN, RoundMode.STOCHASTIC, Scaling.NONE)


@pytest.mark.parametrize("value", ["per_tensor", "PER_TENSOR", " per-tensor ", Scaling.PER_TENSOR])
def test_scaling_parse_accepts_names_and_members(value):
    assert Scaling.parse(value) is Scaling.PER_TENSOR


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(scaling="per_channel"), ValueError, r"scaling='per_channel' is not a scaling; allowed: none, per_tensor"),
    (dict(grad_scaling="amax"), ValueError, r"grad_scaling='amax' is not a scaling; allowed: none, per_tensor"),
    (dict(scaling=1), ValueError, r"scaling=1 is not a scaling"),
    (dict(weight=("e4m3fn", "nearest", "delayed")), ValueError, r"weight=.*scaling='delayed'"),
])
def test_bad_scaling_names_the_field_the_value_and_the_choices(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        Policy.make("e4m3fn", **kwargs)


def test_scaled_policies_differ_from_unscaled_ones_and_describe_the_scaling():
    scaled = Policy.make("e4m3fn", scaling="per_tensor", grad_scaling="none")
    assert scaled != Policy.make("e4m3fn") and hash(scaled) == hash(Policy.make("e4m3fn", scaling="per_tensor",
                                                                               grad_scaling="none"))
    assert scaled.describe() == ("weight|input|output=e4m3fn/nearest/per_tensor, "
                                 "grad_weight|grad_input|grad_output=e4m3fn/stochastic")


@pytest.mark.parametrize("approx", [{"tanh": "nope"}, {"sigmoid": {"method": "pwl", "no_such_option": 1}},
                                    {"softmax": "nope"}])
def test_unknown_approx_methods_and_options_are_refused_at_policy_make(approx):
    with pytest.raises((ValueError, TypeError), match=r"approx\["):
        emunum.Policy.make("e5m2", approx=approx)
    with pytest.raises((ValueError, TypeError), match=r"approx\["):
        emunum.patch(nn.Sequential(nn.Linear(2, 2)), "e5m2", approx=approx)  # no Tanh in the model


def test_a_policy_is_four_parts_each_validating_its_own_fields():
    import dataclasses

    from emunum.datapath import Units
    from emunum.factories import Factories
    from emunum.numerics import Numerics
    from emunum.selection import Selection

    keep = lambda m, n: True  # noqa: E731
    p = Policy.make("e5m2", sr_bits=8, mad="h100_fp8_e4m3", approx={"tanh": "pwl"}, filter=keep)
    assert isinstance(p.numerics, Numerics) and p.numerics.weight == p.weight and p.numerics.sr_bits == 8
    assert isinstance(p.units, Units) and p.units.mad is p.mad and p.mad.terms > 1  # the preset, parsed once
    assert isinstance(p.factories, Factories) and p.factories.approx == p.approx
    assert p.selection == Selection(keep, False)
    q = dataclasses.replace(p, sr_bits=12)
    assert q.numerics.sr_bits == 12 and q.units == p.units and q != p
    with pytest.raises(ValueError, match="sr_bits"):
        Numerics(sr_bits=99)
    with pytest.raises(TypeError, match="keep_first_last must be a bool"):
        Selection(keep_first_last="yes")
    with pytest.raises(TypeError, match="mad must be an emunum.mad.MADUnit"):
        Units(mad=3)
    with pytest.raises(TypeError, match="approx must be a dict"):
        Factories(approx=[1])


def test_a_matrix_instruction_as_the_backward_unit_of_element_gemms_is_refused_when_the_policy_is_made():
    from emunum.mad import MMA_PRESETS
    with pytest.raises(ValueError, match="mad_backward='a100_mma_bf16' is a matrix instruction"):
        Policy.make("e5m2", mad="h100_fp8_e4m3", mad_backward=MMA_PRESETS["a100_mma_bf16"])


UNSIGNED = ["p3109_k8p4uf", "p3109_k8p3u", "ufixed8_4", LogFormat(4, 3, signed=False)]


@pytest.mark.parametrize("fmt", UNSIGNED, ids=str)
@pytest.mark.parametrize("role", ["weight", "grad_weight", "grad_input", "grad_output"])
def test_an_unsigned_format_in_a_signed_role_warns_naming_the_role_the_format_and_what_negatives_become(fmt, role):
    f = emunum.get_format(fmt) if isinstance(fmt, str) else fmt
    neg = float(f.decode(f.encode(np.array([-1.0])))[0])
    with pytest.warns(UserWarning, match=rf"{role}={re.escape(f.name)} \(a negative value rounds to {neg:g}\)") as w:
        Policy.make("e4m3fn", **{role: fmt})
    assert len(w) == 1 and w[0].filename == __file__  # one warning, at the caller's line


def test_unsigned_formats_in_every_role_give_one_warning_naming_the_four_signed_roles():
    with pytest.warns(UserWarning) as w:
        emunum.patch(torch.nn.Linear(4, 4), fmt="p3109_k8p4uf")
    assert len(w) == 1 and w[0].filename == __file__
    assert "give weight/grad_weight/grad_input/grad_output a signed format" in str(w[0].message)


@pytest.mark.parametrize("kwargs", [dict(input="ufixed8_4", output="p3109_k8p4uf"), dict(fmt="p3109_k8p4"),
                                    dict(fmt="e4m3fn", grad="fixed16_12"), dict(fmt="nvfp4")], ids=str)
def test_signed_formats_and_unsigned_activations_do_not_warn(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Policy.make(**kwargs)
