"""Structured config schema for ``experiments/train.py`` (Hydra ConfigStore dataclasses).

Every YAML file under ``conf/`` is merged onto one of these dataclasses, so a misspelt key fails at
composition with OmegaConf's "Key '...' not in '...'" message, and a value of the wrong type fails with
the field's name. Each ``model/``, ``data/`` and ``optim/`` option has its own dataclass (its YAML lists
``/schema/<group>@_here_: <name>`` first in its defaults), because their fields differ. Keys added with
Hydra's ``+key=value`` bypass the schema; ``check_keys`` rejects them.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from emunum import policy as _policy
from emunum.mad.unit import MADUnit


class LogMode(enum.Enum):
    """auto: a tqdm bar on a terminal, plain log lines when there is no tty or the CI variable is set."""

    auto = "auto"
    progress = "progress"
    quiet = "quiet"


class LossScaleMode(enum.Enum):
    none = "none"
    static = "static"
    dynamic = "dynamic"


class Schedule(enum.Enum):
    constant = "constant"
    cosine = "cosine"  # cosine decay from lr to 0 over max_iters, after warmup_iters of linear warm-up


# The library's enums and MADUnit's fields, re-stated for Hydra (which matches YAML values to member *names*),
# derived from the library's own classes so that a field added there reaches the configs without a copy here.
Scaling = enum.Enum("Scaling", {m.value: m.value for m in _policy.Scaling}, module=__name__)
Scaling.__doc__ = "``emunum.policy.Scaling`` by value: " + ", ".join(m.value for m in _policy.Scaling)


# ---- format/ -------------------------------------------------------------------------------------------
# MADUnit's required formats get the schema's defaults; its multiplier is named here (a string, plus bits)
MAD_DEFAULTS = {"mul_fmt": "fp16_169", "acc_fmt": "fp16_169"}
MAD_EXTRA = (("multiplier", Optional[str], None), ("multiplier_bits", Optional[int], None))


def _mad_field(f: dataclasses.Field):
    """(name, YAML type, default) of one ``MADUnit`` field: formats and enums by name, numbers as they are."""
    default = MAD_DEFAULTS.get(f.name, f.default)
    if isinstance(default, enum.Enum):
        return f.name, str, default.name.lower()
    if "Format" in str(f.type):
        return f.name, Optional[str], default
    if isinstance(default, bool):
        return f.name, bool, default
    return f.name, (Optional[int] if default is None else int), default


def _mad_config():
    fields = [_mad_field(f) for f in dataclasses.fields(MADUnit) if f.name != "multiplier"]
    fields += [(n, t, field(default=d)) for n, t, d in MAD_EXTRA]
    fields = [(n, t, d if isinstance(d, dataclasses.Field) else field(default=d)) for n, t, d in fields]
    cls = dataclasses.make_dataclass("MADConfig", fields)
    cls.__module__ = __name__
    cls.__doc__ = ("An ``emunum.mad.MADUnit`` for the GEMMs of Linear/Conv layers (forward and backward): every "
                   "MADUnit field (formats, roundings and orders by name), its multiplier as a name "
                   "(null/exact, mitchell, truncated, drum) plus multiplier_bits.")
    return cls


MADConfig = _mad_config()


@dataclass
class LossScaleConfig:
    mode: LossScaleMode = LossScaleMode.none
    init_scale: float = 65536.0
    growth_interval: int = 1000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5


@dataclass
class OptimLPConfig:
    """Formats (preset names, see emunum.get_format) for emunum.OptimLP; null leaves a role in fp32."""

    weight: Optional[str] = None
    weight_rounding: str = "nearest"
    grad: Optional[str] = None
    grad_rounding: str = "nearest"
    momentum: Optional[str] = None
    momentum_rounding: str = "nearest"
    second_moment: Optional[str] = None
    second_moment_rounding: str = "nearest"


@dataclass
class FormatConfig:
    """A numerics recipe. ``fmt`` null means plain fp32 (no emulation); otherwise the model is passed to
    ``emunum.patch(model, fmt=fmt, mad=<MADUnit from mad>, **policy)``. ``policy`` is handed over as given
    (lists become tuples, e.g. ``grad_weight: [fp8_152, stochastic]``); its keys are the keyword form of
    ``emunum.Policy`` (fmt, grad, rounding, grad_rounding and the Policy fields), checked there, plus
    ``exclude``: a list of torch.nn layer names left unemulated (the YAML form of ``filter=``)."""

    name: str = MISSING  # the "format" entry of results.json
    fmt: Optional[str] = None
    policy: Dict[str, Any] = field(default_factory=dict)
    mad: Optional[MADConfig] = None  # null: the GEMMs run in torch's fp32 on the rounded operands
    scaling: Scaling = Scaling.none
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    optim: OptimLPConfig = field(default_factory=OptimLPConfig)


# ---- model/ --------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    name: str = MISSING


@dataclass
class MLPConfig(ModelConfig):
    name: str = "mlp"
    hidden: List[int] = field(default_factory=lambda: [100, 100])


@dataclass
class CNN1dConfig(ModelConfig):
    """The MNIST-1D paper's CNN: three stride-2 conv layers (kernel 5, 3, 3), ReLU, one linear layer."""

    name: str = "cnn1d"
    channels: int = 25


@dataclass
class ResNetConfig(ModelConfig):
    name: str = "resnet"
    channels: int = 32
    blocks: int = 2  # residual blocks per stage (two stages; the second halves the length)
    batchnorm: bool = True


@dataclass
class TransformerConfig(ModelConfig):
    name: str = "transformer"
    patch: int = 4  # samples per token
    d_model: int = 32
    heads: int = 2
    layers: int = 2
    mlp_ratio: int = 2


@dataclass
class LMConfig(ModelConfig):
    """A decoder-only byte-level language model (experiments/lm.py); its context is ``data.context``."""

    name: str = "lm"
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4


# ---- data/ ---------------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    name: str = MISSING
    target_loss: Optional[float] = None  # default target for regression data (top-level target_loss)
    eval_batch_size: int = 1000


@dataclass
class MNIST1DConfig(DataConfig):
    name: str = "mnist1d"
    num_samples: int = 12000  # examples generated (the MNIST-1D paper: 5000, split 80/20)
    train_samples: int = 4000  # the first ones train (the paper's 4000), the rest validate (8000 by default)
    seed: int = 42  # the dataset's own seed (42 is the published dataset)
    shuffle_seq: bool = False
    cache_dir: Optional[str] = None  # null: $EMUNUM_CACHE_DIR, else ~/.cache/emunum


@dataclass
class DigitsConfig(DataConfig):
    name: str = "digits"
    val_fraction: float = 0.2
    split_seed: int = 0


@dataclass
class Regression13Config(DataConfig):
    """Synthetic regression, 13 inputs -> 1 output: y = w.x + 0.5 sin(3 v.x) + noise (unit-variance x)."""

    name: str = "regression13"
    target_loss: Optional[float] = 0.05
    num_train: int = 4000
    num_val: int = 1000
    noise: float = 0.1
    seed: int = 13


@dataclass
class IdxConfig(DataConfig):
    """MNIST-format IDX files in ``path``: train-images-idx3-ubyte, train-labels-idx1-ubyte, and optionally
    t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte (each may end in .gz). Without the t10k pair a
    ``val_fraction`` of the training set is held out."""

    name: str = "idx"
    path: str = MISSING
    val_fraction: float = 0.1
    split_seed: int = 0
    limit: Optional[int] = None  # use only the first `limit` training examples


@dataclass
class StdlibConfig(DataConfig):
    """Python's standard-library source as bytes (experiments/text_data.py): sorted *.py files, the first
    ``max_bytes``; the last ``val_fraction`` is the validation text. target_loss is in nats per byte."""

    name: str = "stdlib"
    target_loss: Optional[float] = None
    context: int = 64  # tokens (bytes) per training example
    max_bytes: Optional[int] = 1_000_000  # null: the whole selection
    val_fraction: float = 0.1
    eval_batch_size: int = 256


@dataclass
class TextConfig(DataConfig):
    """The bytes of a user's text file ``path``, as ``stdlib`` (``data=text data.path=notes.txt``)."""

    name: str = "text"
    path: str = MISSING
    target_loss: Optional[float] = None
    context: int = 64
    max_bytes: Optional[int] = None  # null: the whole file
    val_fraction: float = 0.1
    eval_batch_size: int = 256


# ---- optim/ --------------------------------------------------------------------------------------------
@dataclass
class OptimConfig:
    name: str = MISSING
    weight_decay: float = 0.0
    schedule: Schedule = Schedule.constant
    warmup_iters: int = 0


@dataclass
class SGDConfig(OptimConfig):
    name: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False


@dataclass
class AdamConfig(OptimConfig):
    name: str = "adam"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8


# ---- dist (torchrun; experiments/ddp.py) ---------------------------------------------------------------
class CommScaling(enum.Enum):
    none = "none"
    per_bucket = "per_bucket"  # each rank scales its bucket by a power of two mapping its amax to <= the max


@dataclass
class DistConfig:
    """The gradient all-reduce of a torchrun run (``emunum.distributed.quantized_allreduce_hook``). All
    defaults: DDP's own fp32 all-reduce. Anything else needs torchrun (several processes)."""

    comm: Optional[str] = None  # the wire format (e5m2, e4m3fn, bf16, ...); null: fp32
    comm_rounding: str = "stochastic"  # rounding onto the wire, of the ring's partial sums and of the result
    ring: bool = False  # ring reduce-scatter + all-gather, each hop's partial sum rounded to comm
    error_feedback: bool = False  # each rank adds its last rounding error to its next bucket
    scaling: CommScaling = CommScaling.none
    result: Optional[str] = None  # round the averaged gradient to this format; null: float32


# ---- top level -----------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    format: FormatConfig = MISSING
    # A MAD-unit preset name (``emunum units``, e.g. h100_fp8_e4m3) for the GEMMs, replacing format.mad:
    # python experiments/train.py format=fp8 mad=h100_fp8_e4m3. null: format.mad as configured.
    mad: Optional[str] = None
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    target_accuracy: float = 0.88  # classification: reached when validation accuracy >= this
    target_loss: Optional[float] = "${data.target_loss}"  # regression: reached when validation loss <= this
    max_iters: int = 4000
    eval_every: int = 20
    stop_at_target: bool = True  # stop at the first evaluation that reaches the target
    seed: int = 0
    threads: Optional[int] = 1  # torch and numba thread counts (null: their defaults); see conf/train.yaml
    batch_size: int = 100
    lr: float = 0.01
    trace: bool = False  # per-layer numerics from emunum.trace into TensorBoard
    checkpoint_every: int = 500  # iterations between checkpoints; 0 disables them
    resume: bool = False  # continue from <run dir>/checkpoint.pt (pass hydra.run.dir=<old run dir>)
    stop_after: Optional[int] = None  # end the process after this iteration, like a kill (for resume tests)
    log: LogMode = LogMode.auto
    device: str = "cpu"  # under torchrun, cuda means cuda:<LOCAL_RANK>
    dist: DistConfig = field(default_factory=DistConfig)


def check_keys(cfg, node_type=None, path: str = "") -> None:
    """Raise ValueError for any key that is not a field of the schema (e.g. one added with ``+key=...``)."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    node_type = node_type or OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(node_type):
        return
    fields = {f.name: f for f in dataclasses.fields(node_type)}
    for key in cfg.keys():
        if key not in fields:
            where = f"{path}.{key}" if path else key
            raise ValueError(f"unknown config key {where!r}; allowed at {path or 'the top level'}: "
                             f"{', '.join(sorted(fields))}")
        if not OmegaConf.is_missing(cfg, key) and isinstance(cfg[key], DictConfig):
            check_keys(cfg[key], OmegaConf.get_type(cfg, key), f"{path}.{key}" if path else key)


def register() -> None:
    """Store the schema in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="schema", name="format", node=FormatConfig)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=f"schema/{group}", name=name, node=node)


SCHEMAS = {
    "model": {"mlp": MLPConfig, "cnn1d": CNN1dConfig, "resnet": ResNetConfig, "transformer": TransformerConfig,
              "lm": LMConfig},
    "data": {"mnist1d": MNIST1DConfig, "digits": DigitsConfig, "regression13": Regression13Config,
             "idx": IdxConfig, "stdlib": StdlibConfig, "text": TextConfig},
    "optim": {"sgd": SGDConfig, "adam": AdamConfig},
}
