"""JSON and file-hash helpers without torch (the CLI's verify and the receipt use them before any model loads)."""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from obliviate.paths import current_umask


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
