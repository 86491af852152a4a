"""The runs of a sweep: ``load_sweep(dir)`` finds every run directory and reads its outcome.

A sweep directory is any tree holding run directories (Hydra's ``multirun/<date>/<time>/<job>/``, or
several single runs). A run directory is one with a ``results.json`` (written by ``experiments/train.py``)
or a Hydra ``.hydra/config.yaml`` without one (a job that died before writing its results: counted as
failed, its format read from the config); a results.json with status "failed" is a job whose exception
was recorded (its ``error`` or ``reason`` is shown). The seed is the results' ``seed`` key, else the
config's; ``stop_at_target`` and ``max_iters`` come from the config (None without one).
"""
from __future__ import annotations

import enum
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from . import files

class Status(enum.Enum):
    """A run's outcome (results.json ``status``); FAILED also covers a job without results.json."""

    REACHED = "reached"
    NOT_REACHED = "not_reached"
    DIVERGED = "diverged"
    FAILED = "failed"



@dataclass(frozen=True)
class Run:
    """One run directory's results (None where results.json has no value)."""

    path: Path
    format: str
    status: Status
    seed: int | None = None
    iterations_to_accuracy: int | None = None
    target_accuracy: float | None = None
    best_accuracy: float | None = None
    final_accuracy: float | None = None
    iterations_run: int | None = None
    seconds_per_iteration: float | None = None
    error: str | None = None
    stop_at_target: bool | None = None  # from the config; False: a fixed-budget run (trained to max_iters)
    max_iters: int | None = None
    iterations_estimate: float | None = None  # results.json's estimator-based iterations-to-accuracy, if any
    estimator: str | None = None  # the name of the estimator behind iterations_estimate
    # the work of one training iteration as the harness counted it (``emunum.analysis.flops.IterationCost``'s
    # fields: flops, param_elements, activation_elements, input_elements), or None
    iteration_cost: dict | None = None



# ---------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------
INT_LIMIT = 1 << 63  # counts and seeds are int64, as everywhere in emunum


def _opt_int(d: dict, key: str, where: Path, signed: bool = False) -> int | None:
    """d[key] as an int (None when absent or null): a finite whole number in the int64 range, not negative
    unless ``signed``."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and (
            not math.isfinite(v) or v != int(v))):
        raise ValueError(f"{where}: {key}={_short(v)} is not an integer")
    if not -INT_LIMIT <= v < INT_LIMIT:
        raise ValueError(f"{where}: {key}={_short(v)} is outside the int64 range")
    if v < 0 and not signed:
        raise ValueError(f"{where}: {key}={v!r} is negative")
    return int(v)


def _opt_float(d: dict, key: str, where: Path, nonnegative: bool = False) -> float | None:
    """d[key] as a float: None when absent, null or NaN; ValueError for ±inf, a number beyond float range,
    a negative value where ``nonnegative``, or anything else."""
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: {key}={_short(v)} is not a number")
    try:
        f = float(v)
    except OverflowError:
        raise ValueError(f"{where}: {key}={_short(v)} is beyond the range of a float") from None
    if math.isnan(f):
        return None
    if math.isinf(f):
        raise ValueError(f"{where}: {key}={v!r} is not finite")
    if nonnegative and f < 0:
        raise ValueError(f"{where}: {key}={v!r} is negative")
    return f


def _short(v, n: int = 60) -> str:
    """repr(v), cut to n characters (a 400-digit integer is named, not printed)."""
    try:
        r = repr(v)
    except ValueError:  # an int past Python's digit limit
        return f"<an integer of about {v.bit_length() * 0.30103:.0f} digits>"
    return r if len(r) <= n else f"{r[:n]}... ({len(r)} characters)"


# what parsing a malformed file may raise besides the parsers' own errors: huge integers past Python's digit
# limit (ValueError), deep nesting (RecursionError), values that overflow (OverflowError)
_ABSURD = (ValueError, RecursionError, OverflowError, MemoryError)

_SKIPPED = object()  # what _parse returns for a file that is not a regular file (noted, not read)


def _parse(path, parse, error: type, what: str, notes):
    """``parse(text of path)``; ``_SKIPPED`` (with a note) for a special file; ValueError naming the file when it
    cannot be read or parsed, or holds absurd values."""
    try:
        return parse(files.read_text(path))
    except files.NotRegular as e:
        if notes is not None:
            notes.append(f"skipped {e}")
        return _SKIPPED
    except (OSError, error) + _ABSURD as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        if str(path) in msg:
            raise ValueError(msg) from None
        raise ValueError(f"{path} is not {what} ({type(e).__name__}: {msg[:200]})") from None



def hydra_config(run_dir: Path, notes: list | None = None) -> dict | None:
    """A run's composed Hydra config (``.hydra/config.yaml``) as plain data, or None without one (or when it
    is not a regular file: then a note is appended to ``notes``)."""
    p = run_dir / ".hydra" / "config.yaml"
    if not os.path.lexists(p):
        return None
    import yaml

    cfg = _parse(p, lambda t: yaml.safe_load(t) or {}, yaml.YAMLError, "a readable YAML config", notes)
    if cfg is _SKIPPED:
        return None
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: expected a mapping, got {type(cfg).__name__}")
    return cfg


def _config_format(cfg: dict | None) -> str | None:
    fmt = (cfg or {}).get("format")
    if isinstance(fmt, dict):
        return fmt.get("name")
    return fmt if isinstance(fmt, str) else None


def load_run(run_dir: Path, notes: list | None = None) -> Run | None:
    """The ``Run`` of one run directory (results.json, else a failed run from .hydra/config.yaml); None (and
    a note in ``notes``) when its results.json is not a regular file."""
    run_dir = Path(run_dir)
    cfg = hydra_config(run_dir, notes)
    cfg_seed = (cfg or {}).get("seed")
    cfg_seed = cfg_seed if isinstance(cfg_seed, int) and not isinstance(cfg_seed, bool) else None
    res = run_dir / "results.json"
    if not os.path.lexists(res):
        fmt = _config_format(cfg)
        if fmt is None:
            if cfg is None:  # a config that was skipped, and no results: nothing left of this run
                return None
            raise ValueError(f"{run_dir}: no results.json, and no format name in .hydra/config.yaml")
        return Run(run_dir, fmt, Status.FAILED, seed=cfg_seed, error="no results.json (the job did not finish)",
                   **_budget(cfg, run_dir))
    d = _parse(res, json.loads, json.JSONDecodeError, "valid JSON", notes)
    if d is _SKIPPED:
        return None
    if not isinstance(d, dict):
        raise ValueError(f"{res}: expected a JSON object, got {type(d).__name__}")
    fmt = d.get("format")
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(f"{res}: format={_short(fmt)} must be a non-empty string")
    try:
        status = Status(d.get("status"))
    except (ValueError, TypeError):
        raise ValueError(f"{res}: status={_short(d.get('status'))} is not a status; allowed: "
                         f"{', '.join(s.value for s in Status)}") from None
    iters = _opt_int(d, "iterations_to_accuracy", res)
    if status == Status.REACHED and iters is None:
        raise ValueError(f"{res}: status 'reached' needs an integer iterations_to_accuracy, got null")
    seed = _opt_int(d, "seed", res, signed=True)
    err = d.get("error") or d.get("reason") or None  # train.py's "reason" says why a run stopped
    return Run(
        path=run_dir, format=fmt, status=status, seed=seed if seed is not None else cfg_seed,
        iterations_to_accuracy=iters if status == Status.REACHED else None,
        target_accuracy=_opt_float(d, "target_accuracy", res), best_accuracy=_opt_float(d, "best_accuracy", res),
        final_accuracy=_opt_float(d, "final_accuracy", res), iterations_run=_opt_int(d, "iterations_run", res),
        seconds_per_iteration=_opt_float(d, "seconds_per_iteration", res, nonnegative=True),
        error=_short(err, 2000) if err is not None and not isinstance(err, str) else err, **_budget(cfg, run_dir),
        **_estimate(d, res, status), iteration_cost=_iteration_cost(d, res),
    )


COST_FIELDS = ("flops", "param_elements", "activation_elements", "input_elements")


def _iteration_cost(d: dict, where: Path) -> dict | None:
    """results.json's ``iteration_cost``: None when absent or null, else an object of the four non-negative
    integers ``COST_FIELDS``."""
    v = d.get("iteration_cost")
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) != set(COST_FIELDS):
        raise ValueError(f"{where}: iteration_cost={_short(v)} must be an object with exactly the keys "
                         f"{', '.join(COST_FIELDS)}")
    return {k: _opt_int(v, k, where) if v[k] is not None else _missing(where, k) for k in COST_FIELDS}


def _missing(where: Path, key: str):
    raise ValueError(f"{where}: iteration_cost.{key} is null; allowed: a non-negative integer")


def _estimate(d: dict, where: Path, status: Status) -> dict:
    """iterations_estimate (a finite number >= 0, reached runs only) and its estimator's name."""
    v, name = _opt_float(d, "iterations_estimate", where, nonnegative=True), d.get("estimator")
    if v is None or status != Status.REACHED:
        return {}
    return {"iterations_estimate": v, "estimator": name if isinstance(name, str) and name else None}


def _budget(cfg: dict | None, run_dir: Path) -> dict:
    """stop_at_target and max_iters from a config (None where absent or not of their type; ValueError for a
    max_iters outside 0 .. 2**63-1)."""
    cfg = cfg or {}
    stop, mx = cfg.get("stop_at_target"), cfg.get("max_iters")
    mx = mx if isinstance(mx, int) and not isinstance(mx, bool) else None
    if mx is not None:
        mx = _opt_int({"max_iters": mx}, "max_iters", run_dir / ".hydra" / "config.yaml")
    return {"stop_at_target": stop if isinstance(stop, bool) else None, "max_iters": mx}


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Directories under ``sweep_dir`` (itself included) holding results.json or .hydra/config.yaml,
    sorted by path with numeric job numbers in numeric order."""
    sweep_dir = Path(sweep_dir)
    found = {p.parent for p in sweep_dir.rglob("results.json")}
    found |= {p.parent.parent for p in sweep_dir.rglob(".hydra/config.yaml")}
    # a sweep dir's own .hydra (hydra writes multirun.yaml there, not config.yaml) is not a run

    def key(p: Path):
        return [(0, int(s), "") if s.isdigit() else (1, 0, s) for s in p.relative_to(sweep_dir).parts]

    return sorted(found, key=key)


def load_sweep(sweep_dir, notes: list | None = None) -> list[Run]:
    """Every run under ``sweep_dir``; ValueError when the directory is missing or holds no runs. Files that
    are not regular (FIFOs, sockets, devices, dangling links) are skipped, each with a note in ``notes``."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ValueError(f"sweep directory {str(sweep_dir)!r} does not exist or is not a directory")
    dirs = find_run_dirs(sweep_dir)
    notes = notes if notes is not None else []
    runs = [r for r in (load_run(d, notes) for d in dirs) if r is not None]
    if not runs:
        raise ValueError(f"sweep directory {str(sweep_dir)!r} holds no runs (no results.json nor .hydra/config.yaml "
                         "below it" + (f"; {'; '.join(notes)}" if notes else "") +
                         "); pass the directory printed by `python experiments/train.py -m ...`")
    return label_by_config(runs)


# config keys that never split a format's runs: the seed (pooled on purpose) and keys that change no numbers
POOLED_KEYS = ("seed", "threads", "trace", "checkpoint_every", "resume", "stop_after", "log", "device",
               "data.cache_dir")


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = json.dumps(v, sort_keys=True, default=str)
    return out


def label_by_config(runs: list[Run]) -> list[Run]:
    """Runs of one format whose Hydra configs differ in any key besides ``POOLED_KEYS`` are not pooled: each
    gets the label ``<format> [key=value, ...]`` naming the keys that differ within its format."""
    import dataclasses

    cfgs = {r.path: hydra_config(r.path) for r in runs}
    flat = {p: _flat(c) for p, c in cfgs.items()}
    out = []
    for fmt in dict.fromkeys(r.format for r in runs):
        group = [r for r in runs if r.format == fmt]
        known = [r for r in group if cfgs[r.path] is not None]
        # a run without a config differs from the others in nothing we know, so it is labelled as such
        # rather than by every key of theirs
        keys = sorted({k for r in known for k in flat[r.path]} - {k for k in POOLED_KEYS})
        differ = [k for k in keys if len({flat[r.path].get(k) for r in known}) > 1]
        for r in group:
            if cfgs[r.path] is None and len(known) > 0:
                r = dataclasses.replace(r, format=f"{fmt} [no .hydra/config.yaml]")
            elif differ:
                tag = ", ".join(f"{k}={json.loads(flat[r.path][k]) if k in flat[r.path] else None}" for k in differ)
                r = dataclasses.replace(r, format=f"{fmt} [{tag}]")
            out.append(r)
    order = {r.path: i for i, r in enumerate(runs)}
    return sorted(out, key=lambda r: order[r.path])
