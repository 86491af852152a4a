"""``quantized_allreduce_hook``: a DDP communication hook that emulates a low-precision all-reduce."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..quantize import quantize_checked
from ..formats import RoundMode
from .spec import CommScaling, CommSpec, hop_seed, pow2_scale, result_seed, wire_seed

_SR_BITS = 32


def quantized_allreduce_hook(fmt, rounding="stochastic", *, seed: int | None = 0, scaling=None, ring: bool = False,
                             error_feedback: bool = False, result_fmt=None, process_group=None) -> "QuantizedAllreduce":
    """A DDP communication hook whose gradients cross an emulated ``fmt`` wire. It keeps its own state:
    ``ddp.register_comm_hook(None, hook)`` (a ProcessGroup passed as the state is used instead of
    ``process_group``; None: the default group). W is the group size, r this rank, ``step`` the hook's count
    of completed iterations (``hook.step``), ``b`` the bucket index; every bucket must be float32.

    Per bucket ``g`` (float32) on rank r:

    1. ``x = g + e_r`` (float32 add) with ``error_feedback``, where ``e_r`` is this rank's residual of the
       bucket from the previous step (zero at first, and when DDP rebuilt the bucket with other parameters);
       else ``x = g``.
    2. ``scaling="per_bucket"``: ``s = 2**k``, the largest power of two with ``amax(x) * s <= fmt.max``
       (``k`` clamped to -126..127; ``s = 1`` when amax is 0, inf or NaN). Without ring, ``amax`` is this rank's
       own; with ring, all ranks share one ``s`` from the largest amax of all ranks times W (one extra
       all-reduce MAX), so that no partial sum exceeds fmt.max. Without scaling, ``s = 1``.
    3. ``q = quantize(x * s, fmt, rounding, seed=wire_seed(seed, r, step, b))`` (float32; ``x * s`` is exact
       unless it falls below float32's normal range). The new residual is ``e_r = float32(x - q / s)``
       (difference taken in float64; non-finite entries, from an overflow, are set to 0).
    4. Without ring: ``S = sum_r q_r / s_r``, an all-reduce SUM in float64 of values each exact in float64.
       S is exact, hence independent of the reduction order, whenever the summands' bits span at most
       53 - ceil(log2 W) binary places: always for unscaled fp8/fp6/fp4 and fp16 wires (e5m2: values are
       multiples of 2**-16 below 2**16, so 32 bits + log2 W), with scaling when the ranks' scales differ little.
       (A float32 sum would not be: 57344 + 2**-16, two e5m2 values, is inexact in float32.)
       With ring: chunks ``c = 0..W-1`` (``torch.tensor_split(x, W)``) are reduced in the ring order
       ``0 -> 1 -> ... -> W-1 -> 0``: at hop ``h = 0..W-2`` rank r sends its partial sum of chunk
       ``(r - h) mod W`` to rank ``r + 1`` and receives chunk ``(r - h - 1) mod W`` from rank ``r - 1``, adding
       its own ``q`` and rounding: ``p = quantize(recv + q_r[c], fmt, rounding, seed=hop_seed(seed, r, step, b,
       h))``. The add is float64: exact for fp8, fp6, fp4 and fp16 wires (two values' bits span at most 42
       places); for bf16 or fp32 wires it may round first when the terms differ by more than 2**53, which with
       ``nearest`` still gives the correctly rounded sum (53 >= 2p + 1, Figueroa 1995). So chunk c is
       ``Q(...Q(Q(q_c + q_{c+1}) + q_{c+2}) ... + q_{c-1})`` (ranks mod W), an fmt value, then owned by rank
       ``c - 1`` and shared by an all-gather. ``S = p / s``.
    5. ``result = float32(S) / W`` (float32 division: exact when W is a power of two, barring underflow);
       with ``result_fmt``, rounded once more: ``quantize(result, result_fmt, rounding,
       seed=result_seed(seed, step, b))``, a seed without the rank, so that every replica gets the same bits.

    ``fmt=None`` (and no ring): DDP's own all-reduce: ``g / W`` summed in float32 by the backend (bit-identical
    to registering no hook), then the optional ``result_fmt``. ``fmt=None, ring=True``: the ring on an fp32
    wire (each hop's sum rounded to float32 with ``rounding``). ``seed=None``: rank 0 draws one from torch's
    default generator at the first call and broadcasts it (``hook.seed`` then holds it).

    The result is bit-identical to ``emunum.distributed.reference_allreduce`` of the ranks' buckets.
    ``state_dict()`` / ``load_state_dict()`` carry ``step``, the seed and this rank's residuals (per rank:
    gather them to checkpoint a run). DDP rebuilds its buckets once after the first iteration; a residual
    whose bucket changed (other parameter shapes, in order) starts again from zero.
    """
    return QuantizedAllreduce(CommSpec.make(fmt, rounding, seed, scaling, result_fmt, ring, error_feedback),
                              process_group)


class QuantizedAllreduce:
    """The hook object (see ``quantized_allreduce_hook``); call signature ``(state, bucket) -> Future``."""

    def __init__(self, spec: CommSpec, process_group=None):
        self.__name__ = self.__qualname__ = "quantized_allreduce_hook"  # DDP's registration and logging read them
        self.spec = spec
        self.process_group = process_group
        self.seed = spec.seed
        self.step = 0
        self.residuals: dict[int, torch.Tensor] = {}
        self.layouts: dict[int, tuple] = {}  # the parameter shapes of the bucket each residual belongs to
        self.agreed = False  # the ranks' settings were compared (at the first bucket)

    def __repr__(self) -> str:
        s = self.spec
        return (f"QuantizedAllreduce(fmt={getattr(s.fmt, 'name', None)}, rounding={s.rounding.name.lower()}, "
                f"seed={self.seed}, scaling={s.scaling.value}, ring={s.ring}, error_feedback={s.error_feedback}, "
                f"result_fmt={getattr(s.result_fmt, 'name', None)}, step={self.step})")

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed,
                "residuals": {int(k): v.detach().cpu().clone() for k, v in self.residuals.items()},
                "layouts": {int(k): [list(shape) for shape in v] for k, v in self.layouts.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.seed = state["seed"]
        self.residuals = {int(k): v.clone() for k, v in state["residuals"].items()}
        self.layouts = {int(k): tuple(tuple(shape) for shape in v) for k, v in state.get("layouts", {}).items()}

    # -- the hook -----------------------------------------------------------------------------------------
    def __call__(self, state, bucket):
        group = state if isinstance(state, dist.ProcessGroup) else self.process_group
        if group is None:
            group = dist.group.WORLD
        buf = bucket.buffer()
        layout = tuple(tuple(p.shape) for p in bucket.parameters()) if self.spec.error_feedback else None
        out = self.reduce(buf, bucket.index(), group, layout)
        if bucket.is_last():
            self.step += 1
        fut = torch.futures.Future()
        fut.set_result(out)
        return fut

    def _resolved_seed(self, group, device) -> int:
        if self.seed is None:  # on the bucket's device: NCCL broadcasts CUDA tensors only
            t = torch.randint(0, 2**62, (1,), dtype=torch.int64).to(device)
            dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
            self.seed = int(t.item())
        return self.seed

    def reduce(self, buf: torch.Tensor, index: int, group, layout: tuple | None = None) -> torch.Tensor:
        """The all-reduced mean of ``buf`` over ``group`` for bucket ``index`` at ``self.step``; ``layout``
        (the bucket's parameter shapes) keeps a residual from being added to a rebuilt bucket."""
        spec, world, rank = self.spec, dist.get_world_size(group), dist.get_rank(group)
        if not self.agreed:
            self._check_agreement(group, buf.device, world)
        if spec.plain:
            out = buf.div_(world)
            dist.all_reduce(out, group=group)
            return self._round_result(out, index, group)
        if buf.dtype != torch.float32:
            raise TypeError(f"quantized_allreduce_hook: a gradient bucket of dtype {buf.dtype}; allowed: "
                            "float32 (fmt=None passes other dtypes through DDP's plain all-reduce)")
        seed = self._resolved_seed(group, buf.device) if spec.rounding == RoundMode.STOCHASTIC else 0
        x = buf
        res = self.residuals.get(index)
        if spec.error_feedback and res is not None and res.shape == buf.shape and self.layouts.get(index) == layout:
            x = buf + res.to(buf.device)
        s = self._scale(x, world, group)
        scaled = x if s == 1.0 else x * s
        q = quantize_checked(scaled, spec.fmt, spec.rounding, wire_seed(seed, rank, self.step, index), _SR_BITS)
        if spec.error_feedback:
            e = (x.double() - q.double() / s).float()
            self.residuals[index] = torch.where(torch.isfinite(e), e, torch.zeros_like(e))
            self.layouts[index] = layout
        if spec.ring:
            total = (self._ring(q, world, rank, index, seed, group) / s).float()
        else:
            total = (q.double() / s)
            dist.all_reduce(total, group=group)
            total = total.float()
        return self._round_result(total.div_(world), index, group)

    def settings(self) -> str:
        """The settings every rank must share (a seed of None is drawn by rank 0, so it agrees)."""
        s = self.spec
        return (f"fmt={getattr(s.fmt, 'name', None)}, rounding={s.rounding.name.lower()}, seed={s.seed}, "
                f"scaling={s.scaling.value}, ring={s.ring}, error_feedback={s.error_feedback}, "
                f"result_fmt={getattr(s.result_fmt, 'name', None)}")

    def _check_agreement(self, group, device, world: int) -> None:
        """Once, at the first bucket: the ranks compare a digest of ``settings()`` (one all-reduce of two
        int64); where they differ, every rank raises ValueError naming each rank's settings (replicas that
        round differently would drift apart silently)."""
        import hashlib

        mine = self.settings()
        d = int.from_bytes(hashlib.sha256(mine.encode()).digest()[:7], "big")
        t = torch.tensor([d, -d], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        if int(t[0]) != d or int(t[1]) != -d:
            every = [None] * world
            try:
                dist.all_gather_object(every, mine, group=group)
                which = "; ".join(f"rank {r}: {v}" for r, v in enumerate(every))
            except Exception:  # a backend without object collectives: this rank's settings only
                which = f"this rank (rank {dist.get_rank(group)}): {mine}"
            raise ValueError(f"quantized_allreduce_hook: the ranks' settings differ; every rank must register the "
                             f"hook with the same settings ({which})")
        self.agreed = True

    def _scale(self, x: torch.Tensor, world: int, group) -> float:
        spec = self.spec
        if spec.scaling == CommScaling.NONE:
            return 1.0
        amax = float(x.abs().amax()) if x.numel() else 0.0
        if spec.ring:  # one scale for all ranks; an inf or NaN anywhere gives every rank s = 1
            top = torch.tensor([amax if math.isfinite(amax) else math.inf], dtype=torch.float64, device=x.device)
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            return pow2_scale(float(top.item()) * world, float(spec.fmt.max))
        return pow2_scale(amax, float(spec.fmt.max))

    def _ring(self, q: torch.Tensor, world: int, rank: int, index: int, seed: int, group) -> torch.Tensor:
        """Ring reduce-scatter (partial sums rounded to fmt at every hop) and all-gather, carried in float64
        (which holds every value of every format exactly); float64 result."""
        spec = self.spec
        chunks = [c.double().clone() for c in torch.tensor_split(q, world)]
        nxt = dist.get_global_rank(group, (rank + 1) % world)
        prv = dist.get_global_rank(group, (rank - 1) % world)
        for hop in range(world - 1):
            send_c, recv_c = (rank - hop) % world, (rank - hop - 1) % world
            recv = torch.empty_like(chunks[recv_c])
            ops = [dist.P2POp(dist.isend, chunks[send_c], nxt, group),
                   dist.P2POp(dist.irecv, recv, prv, group)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            chunks[recv_c] = quantize_checked(recv + chunks[recv_c], spec.fmt, spec.rounding,
                                              hop_seed(seed, rank, self.step, index, hop), _SR_BITS)
        mine = (rank + 1) % world
        size = max(c.numel() for c in chunks)
        send = torch.zeros(size, dtype=torch.float64, device=q.device)
        send[: chunks[mine].numel()] = chunks[mine]
        got = [torch.empty_like(send) for _ in range(world)]
        dist.all_gather(got, send, group=group)
        # rank k owns chunk (k + 1) mod W
        return torch.cat([got[(c - 1) % world][: chunks[c].numel()] for c in range(world)])

    def _round_result(self, out: torch.Tensor, index: int, group) -> torch.Tensor:
        spec = self.spec
        if spec.result_fmt is None:
            return out
        mode = spec.rounding
        seed = self._resolved_seed(group, out.device) if mode == RoundMode.STOCHASTIC else 0
        return quantize_checked(out, spec.result_fmt, mode, result_seed(seed, self.step, index), _SR_BITS)
