"""Output files written whole or not at all: every file the CLI writes goes to a temporary
file beside it and is renamed over the target only once complete (os.replace is atomic
within a directory), so an error, a full disk or Ctrl-C never leaves half a file."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fuseplan.planner.core.errors import InputError


def _refuse(path: Path, what: str, cause: str, fix: str) -> InputError:
    return InputError(f"{path}: cannot write the {what} ({cause}). {fix}")


def check_writable(path: Path, what: str) -> None:
    """Refuse (InputError naming the path, the cause and the fix) a target that cannot be a
    file: a directory, or a file in a folder that does not exist or is not a folder."""
    if path.is_dir():
        raise _refuse(path, what, "it is a directory", "Name a file inside it instead.")
    parent = path.parent
    if not parent.exists():
        raise _refuse(path, what, f"the folder {parent} does not exist",
                      "Create the folder first or choose another path.")
    if not parent.is_dir():
        raise _refuse(path, what, f"{parent} is a file, not a folder", "Choose another path.")


def _cause(exc: OSError) -> tuple[str, str]:
    if exc.errno == errno.ENOSPC:
        return "the disk is full", "Free some space or write elsewhere."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return exc.strerror or "permission denied", "Choose a writable location."
    return exc.strerror or str(exc), "Choose another path."


@contextmanager
def atomic_path(path: Path | str, what: str = "file") -> Iterator[Path]:
    """A temporary path beside `path` to write to; on leaving the block it replaces `path`.

    The temporary file is created with mode 0o666 less the umask (as open() would create
    `path` itself). Any exception, KeyboardInterrupt included, removes it and leaves
    `path` as it was; an OSError becomes an InputError naming `path`, the cause and the fix.
    """
    path = Path(path)
    check_writable(path, what)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except OSError as exc:
            raise _refuse(path, what, *_cause(exc)) from None
        try:
            yield tmp
            os.replace(tmp, path)
        except OSError as exc:
            raise _refuse(path, what, *_cause(exc)) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path | str, data: str | bytes, what: str = "file") -> None:
    """Write `data` (text as UTF-8) to `path` whole or not at all (see atomic_path)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, what) as tmp:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())


def write_with(path: Path | str, writer: Callable[[Path], object], what: str = "file") -> None:
    """Let `writer` (onnx.save, numpy.savez...) write to a temporary path that then replaces
    `path` whole (see atomic_path)."""
    with atomic_path(path, what) as tmp:
        writer(tmp)


def make_dir(path: Path | str, what: str = "output folder") -> Path:
    """Create the folder `path` (and its parents) if needed; InputError naming the path, the
    cause and the fix when it is a file or cannot be created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: cannot use it as the {what} (it is a file). Name a folder, "
                         "or remove the file.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        cause, fix = _cause(exc)
        raise InputError(f"{path}: cannot create the {what} ({cause}). {fix}") from None
    return path
