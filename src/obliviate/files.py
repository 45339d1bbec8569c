"""Files the runs write, without torch: JSON text, atomic writes, hashes, the umask, and output directories.

Output directories are checked before any weights load: where the run will write, whether that is possible, and
that replacing it (overwrite) cannot delete an input or the directory the user stands in.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from obliviate.errors import ObliviateError


def current_umask() -> int:
    """The process umask (read from /proc where possible: setting it to read it is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _resolved(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def _inside(inner: Path, outer: Path) -> bool:
    """inner == outer or inner lies below it (both resolved)."""
    return inner == outer or outer in inner.parents


def _existing_ancestor(p: Path) -> Path:
    """The nearest ancestor of `p` (not p itself) that exists; '.' for a bare relative name."""
    for parent in p.parents:
        if parent.exists():
            return parent
    return Path(".")


def _probe_writable(directory: Path, key: str, path: str | Path) -> None:
    """Create and remove a temporary directory in `directory`: the one reliable test (root, read-only mounts, /proc)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".obliviate-probe-", dir=directory))
    except OSError as exc:
        raise ObliviateError(f"{key} {path}: cannot create directories in {directory} ({exc.strerror or exc}); "
                             f"choose a writable location for {key}") from None


def check_writable_location(path: str | Path, key: str) -> Path:
    """`path` can be created (or replaced) as a directory: no file above it, and its parent is writable."""
    p = Path(path).expanduser()
    above = _existing_ancestor(p)
    if not above.is_dir():
        raise ObliviateError(f"{key} {path} lies under {above}, which is a file, not a directory; "
                             f"choose another {key}")
    _probe_writable(above, key, path)
    return p


FINGERPRINT = "fingerprint.json"  # beside a fine-tuned model: what decided its weights (train/fingerprint.py)


def check_output_dir(path: str | Path, overwrite: bool, inputs: Mapping[str, Any] | None = None,
                     key: str = "output_dir") -> Path:
    """Refuse an output directory the run could not write, would clobber, or whose replacement would delete an
    input (`inputs`: config key -> path the run reads) or the current / home directory."""
    if not str(path):
        raise ObliviateError(f"{key} is empty: set {key}=<directory> for the run's results")
    p, full = Path(path).expanduser(), _resolved(path)
    for what, place in (("the current directory", Path.cwd().resolve()), ("your home directory", _resolved("~"))):
        if _inside(place, full):
            raise ObliviateError(f"{key} {path} is {what} or contains it; a run replaces its output directory as a "
                                 f"whole, so name a new directory for it, e.g. {key}=runs/my-run")
    try:
        taken = p.exists() and (not p.is_dir() or any(p.iterdir()))
    except OSError as exc:  # e.g. a directory on the way that we may not enter
        raise ObliviateError(f"{key} {path}: cannot look at it ({exc.strerror or exc}); choose another {key}") from None
    if taken and not overwrite:
        raise ObliviateError(f"output directory {p} already exists and is " + ("not empty" if p.is_dir() else "a file")
                             + "; choose another output_dir or pass overwrite=true to replace it")
    for name, value in (inputs or {}).items():
        if value and not str(value).startswith(("hf://",)) and Path(str(value)).expanduser().exists() \
                and _inside(_resolved(str(value)), full):
            raise ObliviateError(f"{key} {path} contains {name} {value}, which replacing {key} would delete; "
                                 f"write the run to another {key}")
    check_writable_location(p, key)
    return p


def remove_path(p: Path) -> None:
    """Remove a file, a symlink or a directory tree."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)



def json_safe(x: Any) -> Any:
    """JSON-safe copy: NaN / inf -> null, tuples and numpy arrays -> lists, numpy scalars -> Python numbers."""
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy arrays and scalars, tensors
        return json_safe(x.tolist()) if getattr(x, "ndim", 0) else json_safe(x.item())
    return None if isinstance(x, float) and not math.isfinite(x) else x


def dumps(data: Any) -> str:
    """The project's JSON text: sorted keys, 2-space indent, NaN as null, a final newline."""
    return json.dumps(json_safe(data), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: Path, data: Any) -> None:
    """`dumps(data)` into `path` (inside an output directory that is itself written atomically)."""
    path.write_text(dumps(data), encoding="utf-8")


def write_json_atomic(path: Path, data: Any) -> None:
    """`dumps(data)` to a temporary sibling, then renamed over `path` (mode from the umask)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(dumps(data))
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
