"""Output files written whole or not at all: every file the CLI writes goes to a temporary
file beside it and is renamed over the target only once complete (os.replace is atomic
within a directory), so an error, a full disk or Ctrl-C never leaves half a file."""

from __future__ import annotations

import errno
import fnmatch
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fuseplan.planner.core.errors import InputError


def _refuse(path: Path | str, what: str, cause: str, fix: str) -> InputError:
    """`path` is the path, or the option and the path ("--report out/r.html")."""
    return InputError(f"{path}: cannot write the {what} ({cause}). {fix}")


# pseudo-filesystems: their files are views of the kernel, never a place for fuseplan's output
_KERNEL_DIRS = ("/proc", "/sys")


def kind_of(mode: int) -> str:
    """What a file is, for messages: "a directory", "a character device", "a FIFO"..."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _in_kernel_fs(real: str) -> bool:
    return any(real == d or real.startswith(d + "/") for d in _KERNEL_DIRS)


def check_writable(path: Path, what: str, option: str | None = None, *,
                   parent_made: bool = False) -> None:
    """Refuse (InputError naming the option, the path, the cause and the fix) a target that
    cannot be a file fuseplan writes: a directory, a device, a FIFO, a socket, anything under
    /proc or /sys (a symlink is judged by what it points to), or a file in a folder that
    does not exist or is not a folder (unless `parent_made`: the command makes that folder).
    A regular file or a new name is accepted."""
    path = Path(path)
    name = f"{option} {path}" if option else str(path)
    real = os.path.realpath(path)
    # the spelled path too: /proc/self/fd/1 resolves to whatever stdout is
    if _in_kernel_fs(real) or _in_kernel_fs(os.path.abspath(path)):
        raise InputError(f"{name}: cannot write the {what} (it is a kernel file under /proc or "
                         "/sys, not a place for output). Name a regular file instead.")
    try:
        mode = os.stat(path).st_mode  # follows a symlink: its target is what would be written
    except OSError:
        mode = None  # a new file (or a dangling symlink, which the rename replaces)
    if mode is not None and stat.S_ISDIR(mode):
        raise InputError(f"{name}: cannot write the {what} (it is a directory). Name a file "
                         "inside it instead.")
    if mode is not None and not stat.S_ISREG(mode):
        via = f" (through the symlink to {real})" if os.path.islink(path) else ""
        raise InputError(f"{name}: cannot write the {what}: it is {kind_of(mode)}{via}, not a "
                         "regular file, and fuseplan only writes regular files. Name a new "
                         "file or a regular file instead.")
    parent = path.parent
    if not parent.exists() and not parent_made:
        raise _refuse(name, what, f"the folder {parent} does not exist",
                      "Create the folder first or choose another path.")
    if parent.exists() and not parent.is_dir():
        raise _refuse(name, what, f"{parent} is a file, not a folder", "Choose another path.")


@dataclass(frozen=True)
class Input:
    """A file a command reads: the option naming it (e.g. "--rules", "PLAN"), its path, what it
    is (for messages), the size cap checked before reading (None: any size) and the fix."""

    option: str
    path: Path | str | None
    what: str
    limit: int | None = None
    fix: str = "Pass the path of the file itself."


@dataclass(frozen=True)
class Output:
    """A file (or, with ``folder``, a folder) a command writes: the option naming it, its path,
    what it is, and for a folder the names it writes inside ("pareto_0.json", "rows/")."""

    option: str
    path: Path | str | None
    what: str
    folder: bool = False
    writes: tuple[str, ...] = ()


def check_input(item: Input) -> None:
    """Refuse an input that is not a regular file (a device such as /dev/zero, a FIFO, a
    socket: reading it would never end or would block) or is larger than its cap. Decided
    with stat alone, before the file is opened. A missing file is left to its reader, which
    says how to make one."""
    if item.path is None:
        return
    path = Path(item.path)
    try:
        st = os.stat(path)
    except OSError:
        return
    name = f"{item.option} {path}" if item.option else str(path)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{name}: is a directory, not a {item.what}. {item.fix}")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{name}: cannot read the {item.what}: it is {kind_of(st.st_mode)}, "
                         "not a regular file (reading it would never end or would block), "
                         f"so it is refused before it is opened. {item.fix}")
    if item.limit is not None and st.st_size > item.limit:
        raise InputError(f"{name}: {st.st_size:,} bytes is too large for a {item.what} (at "
                         f"most {item.limit:,}); it is refused before it is read. {item.fix}")


def read_input(path: Path | str, what: str, limit: int, fix: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, checked with stat before it is
    opened (see check_input) and read without blocking; InputError otherwise."""
    path = Path(path)
    check_input(Input("", path, what, limit, fix))
    # O_NONBLOCK: should the path turn into a FIFO after the stat, open() still returns
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the stat and the open
            raise InputError(f"{path}: is not a regular file (it changed while being opened). "
                             f"{fix}")
        data = f.read(limit + 1)  # at most one byte past the cap, whatever the file became
    if len(data) > limit:
        raise InputError(f"{path}: is larger than {limit:,} bytes, too large for a {what}; "
                         f"it is refused. {fix}")
    return data


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file: the same real path, or the same inode (hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(folder: str, name: str, path: str) -> bool:
    """Whether `path` is `name` inside `folder`: a file name, a pattern ("pareto_*.json") or
    everything under a subfolder ("rows/")."""
    if "*" in name:
        real = os.path.realpath(path)
        return (os.path.dirname(real) == os.path.realpath(folder)
                and fnmatch.fnmatch(os.path.basename(real), name))
    target = os.path.realpath(os.path.join(folder, name))
    real = os.path.realpath(path)
    if name.endswith("/"):
        return real == target or real.startswith(target.rstrip("/") + "/")
    return _same(target, path)


def _other_name(path: Path, folder: bool = False) -> str:
    """A path beside `path` for the message's fix: x.out.json, or folder-out."""
    if folder:
        return str(path.with_name(f"{path.name}-out"))
    return str(path.with_name(f"{path.stem}.out{path.suffix}"))


def check_io(inputs: Sequence[Input], outputs: Sequence[Output]) -> None:
    """Check a command's files before it does any work, so that an output never destroys an
    input: refuse (InputError, one paragraph naming the option, the path and the fix)

    - an input that is not a regular file or exceeds its size cap (:func:`check_input`);
    - an output that resolves (realpath, or the same inode) to one of the inputs, or to
      another output of the command, or (for a folder) that would write over an input;
    - an output that cannot be a file fuseplan writes (:func:`check_writable`) or a folder
      that is not one.
    """
    for item in inputs:
        check_input(item)
    read = [i for i in inputs if i.path is not None and os.path.lexists(i.path)]
    wanted = [o for o in outputs if o.path is not None]
    for n, out in enumerate(wanted):
        path = Path(out.path)  # type: ignore[arg-type]
        if out.folder:  # a file where the folder should be: refused as such, never written
            check_folder(path, out.what, out.option)
        for item in read:
            if _same(str(path), str(item.path)):
                where = ""
            elif out.folder and any(_inside(str(path), name, str(item.path))
                                    for name in out.writes):
                where = " inside it"
            else:
                continue
            raise InputError(
                f"{out.option} {path}: refused before any work: the {out.what} would overwrite "
                f"{item.option} {item.path}{where}, the {item.what} this command reads, and "
                f"destroy it. Write the output elsewhere, e.g. "
                f"`{out.option} {_other_name(path, out.folder)}`.")
        for other in wanted[:n]:
            first = Path(other.path)  # type: ignore[arg-type]
            clash = (_same(str(path), str(first)) if not (out.folder or other.folder) else
                     other.folder and not out.folder and
                     any(_inside(str(first), name, str(path)) for name in other.writes))
            if clash:
                raise InputError(
                    f"{out.option} {path}: refused before any work: the {out.what} is also "
                    f"the {other.what} of {other.option} {first}, and one would overwrite "
                    f"the other. Give each output its own path, e.g. "
                    f"`{out.option} {_other_name(path)}`.")
        if not out.folder:  # a file in a folder output is fine: that folder is made first
            made = any(o.folder and _same(str(o.path), str(path.parent)) for o in wanted)
            check_writable(path, out.what, out.option, parent_made=made)


def check_folder(path: Path, what: str, option: str) -> None:
    """Refuse a folder output that exists as something other than a folder, or lies under
    /proc or /sys; a missing folder is fine (it is made when written to)."""
    real = os.path.realpath(path)
    if _in_kernel_fs(real) or _in_kernel_fs(os.path.abspath(path)):
        raise InputError(f"{option} {path}: cannot use it as the {what} (it lies under /proc "
                         "or /sys, kernel files, not a place for output). Name a folder of "
                         "your own.")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        raise InputError(f"{option} {path}: cannot use it as the {what} (it is "
                         f"{kind_of(mode)}, not a folder; nothing was written). Name a folder "
                         "instead.")


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
