"""Is the Hugging Face hub reachable? Asked once per process, answered in seconds.

Without HF_HUB_OFFLINE=1, transformers / datasets retry an unreachable hub for about two minutes before
failing. One TCP connect (3 s) to the endpoint (HF_ENDPOINT, else huggingface.co:443; the HTTPS proxy
when one is set) tells us first, so a hub id on an offline machine fails fast with a message saying
how to work offline.
"""
from __future__ import annotations

import os
import re
import socket
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from obliviate.errors import ObliviateError

TIMEOUT_S = 3.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "true", "yes", "on")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_answers: dict[tuple[str, int], str | None] = {}
_SKIPPING: ContextVar[bool] = ContextVar("obliviate_hub_skipping", default=False)


class HubSkipped(ObliviateError):
    """A check that needs the hub, left out because `obliviate validate --offline` asked for no hub access."""


@contextmanager
def skipping_hub() -> Iterator[None]:
    """While active, every hub access (require_hub) raises HubSkipped instead of connecting: `validate --offline`
    checks everything else and lists what it skipped."""
    token = _SKIPPING.set(True)
    try:
        yield
    finally:
        _SKIPPING.reset(token)


def skipping() -> bool:
    """Whether hub access is being skipped (inside `skipping_hub`)."""
    return _SKIPPING.get()


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE) is set: only cached files are used."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


def looks_like_repo_id(text: str) -> bool:
    """`name` or `owner/name` as the hub spells repository ids; a path (/x, ./x, ../x, ~/x, a/b/c) never is."""
    text = str(text)
    return bool(_REPO_ID.fullmatch(text)) and ".." not in text and not text.endswith(".") and len(text) <= 96


def is_owner_name(text: str) -> bool:
    """`owner/name` exactly, as a repository to push to is named (`looks_like_repo_id` with the owner required)."""
    return looks_like_repo_id(text) and str(text).count("/") == 1


def _endpoint() -> tuple[str, int]:
    """(host, port) a hub request first connects to: the HTTPS/HTTP proxy if one is set, else the endpoint."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    names = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy") if url.scheme == "https" else \
        ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    proxy = next((os.environ[n] for n in names if os.environ.get(n)), None)
    if proxy:
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    port = url.port or (443 if url.scheme == "https" else 80)
    return url.hostname or "", port


def _connect(host: str, port: int, out: list[str | None]) -> None:
    try:
        socket.create_connection((host, port), timeout=TIMEOUT_S).close()
        out.append(None)
    except OSError as exc:
        out.append(f"cannot connect to {host}:{port}: {exc.strerror or exc}")


def unreachable() -> str | None:
    """Why the hub cannot be reached (None when a TCP connection opens); cached per endpoint and process."""
    host, port = _endpoint()
    if (host, port) not in _answers:
        out: list[str | None] = []
        # A thread, because the DNS lookup before the connect does not honour the socket timeout.
        worker = threading.Thread(target=_connect, args=(host, port, out), daemon=True)
        worker.start()
        worker.join(TIMEOUT_S + 0.5)
        _answers[(host, port)] = out[0] if out else f"no answer from {host}:{port} within {TIMEOUT_S:g} s"
    return _answers[(host, port)]


def require_hub(what: str) -> None:
    """Raise ObliviateError at once when `what` (e.g. "model.path 'org/model'") needs the hub and it is unreachable.

    Does nothing offline (HF_HUB_OFFLINE=1): then the libraries read their cache and fail fast themselves. Inside
    `skipping_hub` it raises HubSkipped naming `what`, so the caller can list the check it left out."""
    if skipping():
        raise HubSkipped(f"{what}: a hub id, not fetched (validate --offline)")
    if offline():
        return
    why = unreachable()
    if why:
        raise ObliviateError(f"{what}: no such file or folder in {Path.cwd()}, and as a hub id it needs the Hugging "
                             f"Face hub, which is unreachable ({why}). A folder: create it first (a preset's header "
                             "names the command that writes it, e.g. obliviate finetune or obliviate demo) or correct "
                             "the path; a hub id offline: set HF_HUB_OFFLINE=1 to use files already in the hub cache")


def check_can_push() -> None:
    """Raise a clear error before anything is sent when pushing cannot work: offline mode, no token, no hub."""
    if offline():
        raise ObliviateError("pushing needs the Hugging Face hub, but offline mode is set (HF_HUB_OFFLINE / "
                             "TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE); unset it, or send nothing (`obliviate push --dry-run`; "
                             "hub.push=false in a run config)")
    import huggingface_hub

    if not huggingface_hub.get_token():
        raise ObliviateError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (a token with write access)")
    why = unreachable()
    if why:
        raise ObliviateError(f"the Hugging Face hub is unreachable ({why}); nothing was sent")
