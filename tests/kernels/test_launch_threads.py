"""kernels/threads.py (named apart from tests/reliability/test_threads.py): the shares cover [0, n) exactly once,
in order; a launch runs every item once on any thread count (one call when not parallel) and raises a share's
exception in the caller."""
import numpy as np
import pytest
from numba import njit

from emunum.kernels import threads


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_shares_partition_the_range_in_order(n, parts):
    s = threads.shares(n, parts)
    assert s[0][0] == 0 and s[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(s, s[1:]))
    sizes = [hi - lo for lo, hi in s]
    assert max(sizes) - min(sizes) <= 1
    assert len(s) == max(1, min(parts, n))


@njit(nogil=True)
def _mark(lo, hi, out):
    for i in range(lo, hi):
        out[i] += i + 1


@pytest.mark.parametrize("t", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1, 4, 1000])
def test_launch_runs_every_item_once(t, n):
    out = np.zeros(n, np.int64)
    threads.launch(_mark, n, out, threads=t)
    np.testing.assert_array_equal(out, np.arange(1, n + 1))


def _fail_in_second_share(lo, hi, seen):
    seen.append((lo, hi))
    if lo > 0:
        raise ValueError(f"share {lo}")


def test_launch_raises_a_share_error_after_all_shares_end():
    seen = []
    with pytest.raises(ValueError, match="share"):
        threads.launch(_fail_in_second_share, 10, seen, threads=3)
    assert sorted(seen) == [(0, 4), (4, 7), (7, 10)]


def _nested(lo, hi, out):
    threads.launch(_mark, out.shape[1], out[lo], threads=2)  # the workers are busy: runs serially
    for i in range(lo + 1, hi):
        threads.launch(_mark, out.shape[1], out[i], threads=2)


def test_launch_inside_a_share_and_from_other_threads_gives_the_same_items():
    """Invariant: a launch while the workers are held (from a share, or from another Python thread) still runs
    every item once."""
    out = np.zeros((6, 50), np.int64)
    threads.launch(_nested, 6, out, threads=3)
    np.testing.assert_array_equal(out, np.tile(np.arange(1, 51), (6, 1)))
    import concurrent.futures
    outs = [np.zeros(3000, np.int64) for _ in range(8)]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda o: threads.launch(_mark, o.size, o, threads=2), outs))
    for o in outs:
        np.testing.assert_array_equal(o, np.arange(1, 3001))


def _record(lo, hi, seen):
    seen.append((lo, hi))


@pytest.mark.parametrize("threads_", [None, 3])
def test_launch_not_parallel_is_one_call_over_the_range(threads_):
    seen = []
    threads.launch(_record, 10, seen, parallel=False, threads=threads_)
    assert seen == [(0, 10)]
