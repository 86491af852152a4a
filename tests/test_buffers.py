"""emunum.buffers: fresh outputs (huge-page advice) change no value, shape, dtype or layout."""
from __future__ import annotations

import platform
import resource
import sys

import pytest
import torch

import emunum
from emunum import buffers


@pytest.mark.parametrize("shape", [(1 << 22,), (1024, 4097)])
def test_empty_like_is_a_contiguous_tensor_like_x(shape):
    x = torch.zeros(shape)
    y = buffers.empty_like(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_advice_on_small_or_view_tensors_is_harmless():
    small = torch.arange(10.0)
    buffers.advise_huge_pages(small)
    assert torch.equal(small, torch.arange(10.0))
    big = torch.arange(float(1 << 22))
    buffers.advise_huge_pages(big[5:])  # a view: advice covers the aligned inside of its storage only
    assert torch.equal(big, torch.arange(float(1 << 22)))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_large_fresh_output_equals_the_out_path_bit_for_bit(rounding, layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 1536, generator=g)  # 12 MiB: above HUGE_MIN_BYTES
    if layout == "transposed":
        x = x.t()
    assert x.numel() * x.element_size() >= buffers.HUGE_MIN_BYTES
    before = x.clone()
    fresh = emunum.quantize(x, "e5m2", rounding, seed=3)
    out = torch.empty_like(x)
    emunum.quantize(x, "e5m2", rounding, seed=3, out=out)
    assert torch.equal(x, before)
    assert fresh.shape == x.shape and fresh.dtype == x.dtype
    assert torch.equal(fresh.view(torch.int32), out.view(torch.int32))


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_retained_memory_serves_the_next_large_tensor_without_page_faults():
    """After ``retain_freed_memory``, a 64 MB tensor freed and allocated again reuses mapped pages: in a loop's
    steady state (within a few rounds, however fragmented the heap of the process is) writing it costs (almost)
    no minor page faults, where glibc's default unmaps a freed block of this size and every round faults all
    16384 of its 4 KiB pages in again."""
    assert buffers.retain_freed_memory() is True
    n = 1 << 24
    faults = []
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        y = torch.empty(n)
        y.fill_(1.0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert float(y.sum()) == n
        del y
    assert min(faults[2:]) < 1000, faults


@pytest.mark.parametrize("bad", [0, -1, 2**31, 1.5, True, "1G"])
def test_retain_freed_memory_rejects_a_bad_limit(bad):
    with pytest.raises(ValueError, match="limit_bytes"):
        buffers.retain_freed_memory(bad)
