"""Keep numba's on-disk cache honest.

numba's ``cache=True`` keys a cached kernel on the file that defines it, not on the files it calls, so an
edit of ``kernels/scalar/`` alone would leave stale machine code behind. ``guard(module_file, deps)`` drops the
module's cache entries whenever the digest of the module and its dependencies changes.
"""
import glob
import hashlib
import os


def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _cache_dirs(module_file: str) -> list[str]:
    here = os.path.join(os.path.dirname(os.path.abspath(module_file)), "__pycache__")
    dirs = [here]
    user = os.environ.get("NUMBA_CACHE_DIR")
    if user:
        dirs.append(user)
    return dirs


def guard(module_file: str, deps: list[str]) -> None:
    """Remove ``module_file``'s numba cache files if it or any of ``deps`` changed since last time."""
    stem = os.path.splitext(os.path.basename(module_file))[0]
    digest = _digest([module_file, *deps])
    for d in _cache_dirs(module_file):
        stamp = os.path.join(d, f"{stem}.emunum-stamp")
        try:
            with open(stamp) as f:
                if f.read() == digest:
                    continue
        except OSError:
            pass
        for path in glob.glob(os.path.join(d, "**", f"{stem}.*.nb[ic]"), recursive=True):
            try:
                os.remove(path)
            except OSError:
                pass
        try:
            os.makedirs(d, exist_ok=True)
            with open(stamp, "w") as f:
                f.write(digest)
        except OSError:
            pass  # read-only install: numba falls back to its user-wide cache, keyed on this file's version
