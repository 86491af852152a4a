"""Keep numba's on-disk cache honest, shared safely, and optional.

numba's ``cache=True`` keys a cached kernel on the file that defines it, not on the files it calls, so an
edit of a core in ``kernels/scalar/`` alone would leave stale machine code behind. ``guard(module_file,
deps)``, called at the top of every kernel module before its kernels are defined, registers the module with
a cache locator of its own (``_DigestLocator``, first in numba's list) that puts the module's cache files in
a directory named after the digest of the module and its dependencies:

    <base>/emunum-<module stem>-<digest>/

- A change to any dependency gives a new digest, so stale code is never loaded; nothing is deleted, and no
  other project's files (nor another emunum version's) are touched.
- Two checkouts or versions sharing one ``NUMBA_CACHE_DIR`` keep separate directories when their sources
  differ, and share one when they are the same: both stay warm.
- ``<base>``: ``NUMBA_CACHE_DIR`` if set, else ``kernels/__pycache__`` beside the sources, else the user's
  cache (``$XDG_CACHE_HOME`` or ``~/.cache``)``/emunum``: the first that is writable. Where none is (a read-only
  install with a read-only home), kernels compile into a private temporary directory that is removed at exit,
  after one warning that says how to keep them: set ``NUMBA_CACHE_DIR`` to a writable directory.
- Safe across processes that compile side by side (``pytest -n``, sweeps): numba picks a data file's name from
  the index it read, so two processes saving different kernels at once could give both one name, and a later
  load the other kernel's code. In emunum's directories a save holds an exclusive lock on the directory
  (``fcntl.flock`` on ``.lock``), re-reads the index under it and writes the data file before the index.
- The freshness stamp is the digest, not the file's mtime: checkouts with the same sources share the entries.
- The digest covers, besides the listed deps, every file of this kernels tree that the module imports
  relatively (``from .x import``, ``from . import x``, ``from ..x import``), transitively: a kernel freezes the
  values of the globals it reads (tile sizes, constants) and the code of what it calls at compile time, and a
  hand-kept list missed one (gemm_approx read gemm_fast's tile width through gemm_cpu: a changed width left
  cached kernels tiling the old way while the host counted tiles the new way).
"""
from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import re
import shutil
import tempfile
import warnings

from numba.core import caching as _caching

from . import _inline_copy

_inline_copy.install()  # opt-in (EMUNUM_NUMBA_INLINE_COPY=1): every kernel module imports this one first

try:
    import fcntl
except ImportError:  # not POSIX: numba's own unlocked save
    fcntl = None

_CacheImpl = getattr(_caching, "CacheImpl", None) or _caching._CacheImpl  # public from numba 0.61 on
_CacheLocator = _caching._CacheLocator

_REGISTERED: dict[str, str] = {}  # realpath of a kernel module -> its cache directory name
_base: str | None = None


def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _writable(d: str) -> bool:
    try:
        os.makedirs(d, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".emunum-probe-"):
            pass
        return True
    except OSError:
        return False


def _candidates() -> list[str]:
    out = []
    user = os.environ.get("NUMBA_CACHE_DIR")
    if user:
        out.append(user)
    out.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"))
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out.append(os.path.join(xdg, "emunum"))
    return out


def cache_base() -> str:
    """The directory that holds emunum's kernel caches (chosen once per process, see the module doc)."""
    global _base
    if _base is None:
        for d in _candidates():
            if _writable(d):
                _base = d
                break
        else:
            _base = tempfile.mkdtemp(prefix="emunum-numba-")
            atexit.register(shutil.rmtree, _base, ignore_errors=True)
            warnings.warn(
                "emunum: no writable directory for numba's kernel cache (tried "
                f"{', '.join(_candidates())}); kernels are compiled for this process only. Set NUMBA_CACHE_DIR "
                "to a writable directory to keep them.", RuntimeWarning, stacklevel=2)
    return _base


class _DigestLocator(_CacheLocator):
    """numba cache locator for registered emunum kernel modules: one directory per source digest."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(cache_base(), _REGISTERED[os.path.realpath(py_file)])

    def ensure_cache_path(self):
        os.makedirs(self._cache_path, exist_ok=True)
        tempfile.TemporaryFile(dir=self._cache_path).close()  # raises if not writable, as numba's own do

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return os.path.basename(self._cache_path)  # the digest: the directory already names the sources

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.realpath(py_file) not in _REGISTERED:
            return None
        return cls(py_func, py_file)


if _DigestLocator not in _CacheImpl._locator_classes:
    _CacheImpl._locator_classes.insert(0, _DigestLocator)

_IndexDataCacheFile = _caching.IndexDataCacheFile
_numba_save = getattr(_IndexDataCacheFile, "_emunum_unlocked_save", _IndexDataCacheFile.save)
_INTERNALS = all(hasattr(_IndexDataCacheFile, a) for a in ("_load_index", "_save_index", "_save_data", "_data_name"))


def _locked_save(self, key, data):
    """numba's ``IndexDataCacheFile.save`` under an exclusive lock for emunum's directories (module doc)."""
    if fcntl is None or not _INTERNALS or os.path.basename(self._cache_path) not in _REGISTERED.values():
        return _numba_save(self, key, data)
    with open(os.path.join(self._cache_path, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        overloads = self._load_index()
        name = overloads.get(key)
        if name is None:
            used = set(overloads.values())
            name = next(n for n in map(self._data_name, itertools.count(1)) if n not in used)
        self._save_data(name, data)  # first: an index entry never points at a missing or older file
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)


_IndexDataCacheFile._emunum_unlocked_save = _numba_save
_IndexDataCacheFile.save = _locked_save


_ROOT = os.path.dirname(os.path.realpath(__file__))
_RELATIVE = re.compile(r"^[ \t]*from[ \t]+(\.+)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORTS: dict[str, list[str]] = {}


def _imported_files(path: str, root: str) -> list[str]:
    """The files under ``root`` of the modules that the Python file ``path`` imports relatively."""
    key = path + "\0" + root
    if key not in _IMPORTS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = []
        for dots, module, names in _RELATIVE.findall(text):
            base = os.path.dirname(path)
            for _ in range(len(dots) - 1):
                base = os.path.dirname(base)
            names = re.sub(r"#[^\n]*", "", names).strip("()")
            targets = [module] if module else [n.split()[0] for n in names.split(",") if n.split()]
            for target in targets:
                stem = os.path.join(base, *target.split("."))
                for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
                    if os.path.isfile(candidate) and os.path.realpath(candidate).startswith(root + os.sep):
                        found.append(os.path.realpath(candidate))
                        break
        _IMPORTS[key] = found
    return _IMPORTS[key]


def sources(module_file: str, deps=(), root: str = _ROOT) -> list[str]:
    """The files a kernel module's cache digest covers: ``module_file`` first, then ``deps`` and every file under
    ``root`` that they import relatively, transitively (sorted)."""
    first = os.path.realpath(module_file)
    seen, todo = set(), [first, *(os.path.realpath(d) for d in deps)]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(_imported_files(p, root))
    return [first, *sorted(seen - {first})]


def guard(module_file: str, deps: list[str]) -> None:
    """Register ``module_file``: its kernels cache under a directory keyed by the digest of ``sources(module_file,
    deps)`` (module doc)."""
    stem = os.path.splitext(os.path.basename(module_file))[0]
    _REGISTERED[os.path.realpath(module_file)] = f"emunum-{stem}-{_digest(sources(module_file, deps))}"


def variant(fn, tag):
    """``fn`` (a closure made by a kernel factory, before ``njit``) with ``_<tag>`` added to its qualname.

    numba names a compiled function's symbol after its qualname and a per-process counter, and a kernel loaded
    from the disk cache keeps the name it was compiled under. Two variants of one closure compiled in different
    processes can so carry one name, and a kernel compiled later in a process that loaded both calls whichever
    the JIT resolved first (seen: a parallel launcher running another rounding mode's loop). The tag makes each
    variant's name its own in every process."""
    fn.__qualname__ = f"{fn.__qualname__}_{tag}"
    return fn
