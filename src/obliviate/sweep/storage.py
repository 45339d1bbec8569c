"""Where a sweep's studies live: an Optuna storage from a database URL (SQLite by default, in the output directory;
PostgreSQL or MySQL shared by workers on several machines) or a journal file."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from obliviate.errors import ConfigError, ObliviateError

STORAGE_FILE = "sweep.db"
# study attributes beside θ0's and the retain model's metrics on the verdict's rows: their per-row values there
ORIGINAL_ROWS, RETAIN_ROWS = "original_report_rows", "retain_report_rows"


def references_done(study: Any, held_out: bool) -> bool:
    """Whether a study holds θ0's evaluation and, when the sweep holds rows out (`held_out`), θ0's per-row values on
    them (studies made before those were kept get them once more)."""
    return "original" in study.user_attrs and (not held_out or ORIGINAL_ROWS in study.user_attrs)


def recorded_url(directory: Path, recorded: Any) -> str | None:
    """The storage URL of the sweep in `directory` whose sweep.yaml reads `recorded`: its shared storage, else the
    SQLite file in the folder; None when that file does not exist (the sweep never ran)."""
    if recorded.get("storage"):
        return str(recorded["storage"])
    return f"sqlite:///{directory.resolve() / STORAGE_FILE}" if (directory / STORAGE_FILE).is_file() else None


def open_storage(url: str) -> Any:
    """An Optuna storage from a database URL or a journal file; a clear error when it cannot be opened."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = url[len("journal:"):] if url.startswith("journal:") else (url if url.endswith(".journal") else None)
    try:
        if journal is not None:
            from optuna.storages.journal import JournalFileBackend

            path = Path(journal).expanduser()
            if not path.parent.is_dir():
                raise ConfigError(f"storage {url}: the folder {path.parent} does not exist; create it or name another "
                                  "journal file")
            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        if "://" not in url:
            raise ConfigError(f"storage {url!r} is neither a database URL (sqlite:///sweep.db, "
                              "postgresql://user:pass@host/db, mysql://...) nor a journal file (journal:PATH or "
                              "PATH.journal)")
        return _rdb(url)
    except ObliviateError:
        raise
    except Exception as exc:  # sqlalchemy / driver errors: a missing driver, a refused connection, a bad URL
        raise ConfigError(f"storage {url} cannot be opened: {' '.join(str(exc).split())[:300]} (check the URL, the "
                          "database driver and that the server is reachable)") from None


def all_studies(url: str) -> list[Any]:
    """Every study in the storage at `url` (open_storage's URLs), loaded."""
    import optuna

    store = open_storage(url)
    return [optuna.load_study(study_name=s.study_name, storage=store) for s in optuna.get_all_study_summaries(store)]


def _rdb(url: str, attempts: int = 5) -> Any:
    """An RDB storage; workers started together may race to create the tables (one sees a half-made schema or a
    lock): such a start is tried again after a short pause, a bad URL or a refused connection fails at once."""
    import optuna
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}
                                              if url.startswith("sqlite") else None)
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as exc:
            racing = any(s in str(exc) for s in ("already exists", "locked", "UNIQUE constraint", "no such table"))
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")
