"""Write output directories atomically: a crash never leaves a half-written checkpoint or clobbers an old one."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)
# Every directory longbird writes holds this file: `overwrite` replaces only such directories, never a user's own.
OUTPUT_MARKER = ".longbird-output"


def check_not_read(out, reads) -> None:
    """ValueError when the output directory `out` is, holds or lies inside one of `reads` (the directories a run or a
    conversion reads): replacing it would delete what is being read (`evaluate --model M --out M --overwrite` left
    M without its weights)."""
    target = Path(out).resolve()
    for read in reads:
        if read is None or not Path(read).exists():
            continue  # a named embedded source, or a path whose absence the loading names
        source = Path(read).resolve()
        if target == source or source.is_relative_to(target) or target.is_relative_to(source):
            raise ValueError(f"--out {out} is, holds or lies in {read}, which is being read: replacing it would "
                             "delete what is read; choose another --out")


def check_writable(out: str | os.PathLike, overwrite: bool = False) -> None:
    """FileExistsError unless `write_directory_atomically(out, ..., overwrite)` may write `out`; commands call it
    before their work, so that a refusal does not come after minutes of it. A copy of `out` an interrupted
    replacement set aside is put back first (`restore_set_aside`)."""
    out = Path(out)
    restore_set_aside(out)
    blocking = next((parent for parent in out.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise FileExistsError(f"cannot write {out}: {blocking} is a file, not a directory; choose another output")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"refusing to write {out}: it is a file; remove it yourself or choose another output")
    if out.exists() and not (out / OUTPUT_MARKER).is_file():  # first: --overwrite would not help there
        raise FileExistsError(f"refusing to replace {out}: it is a directory longbird did not write (no "
                              f"{OUTPUT_MARKER} marker); remove it yourself or choose another output")
    if out.exists() and not overwrite:
        raise FileExistsError(f"output directory {out} already exists; pass overwrite=True (--overwrite) to replace it")


def write_directory_atomically(out: str | os.PathLike, write: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Call `write(tmp_dir)` on a sibling temporary directory, then rename it to `out`. An existing `out` is replaced
    only with `overwrite` and only if longbird wrote it (it holds OUTPUT_MARKER); one that appeared during `write`
    (another process's) is kept without `overwrite` (FileExistsError)."""
    out = Path(out)
    check_writable(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    backup = None
    try:
        staging.chmod(_default_mode(0o777))  # mkdtemp makes 0700; the result should look like any new directory
        write(staging)
        (staging / OUTPUT_MARKER).write_text("written by longbird; `--overwrite` may replace this directory\n")
        ordinary_permissions(staging)
        if out.exists():
            if not overwrite:
                raise FileExistsError(f"output directory {out} appeared while this one was written (another "
                                      "process?); it is kept")
            backup = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, backup / out.name)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if backup is not None and (backup / out.name).exists() and not out.exists():
            os.replace(backup / out.name, out)  # the new copy never arrived: the old one goes back
        raise
    finally:
        if backup is not None and out.exists():  # else the old copy is all there is: restore_set_aside finds it
            shutil.rmtree(backup, ignore_errors=True)
    return out


# A replacement holds the old copy aside for the milliseconds between its two renames; one older than this was left by
# a killed process, not by a replacement in progress in another.
SET_ASIDE_SECONDS = 60.0


def restore_set_aside(out: Path) -> None:
    """Put back the copy of `out` that a killed replacement set aside (`.NAME.old-*/NAME`, the newest) when nothing is
    left at `out`; warn of what killed writes left: temporary copies (`.NAME.partial-*`) and old copies beside an
    `out` that is there (not removed: another process may be writing one now, or the user may want the old one)."""
    if not out.parent.is_dir():
        return
    now = time.time()
    stale = [backup for backup in out.parent.glob(f".{out.name}.old-*")
             if (backup / out.name).is_dir() and now - backup.stat().st_mtime > SET_ASIDE_SECONDS]
    for backup in sorted(stale, key=lambda path: path.stat().st_mtime, reverse=True):
        if out.exists():
            break
        try:
            os.replace(backup / out.name, out)
        except FileNotFoundError:  # another process (under torchrun every one checks) put it back first
            continue
        logger.warning("restored %s from %s, where an interrupted replacement had set it aside", out, backup)
        shutil.rmtree(backup, ignore_errors=True)
    leftovers = sorted(path.name for path in out.parent.glob(f".{out.name}.partial-*")) + sorted(
        backup.name for backup in stale if backup.exists())
    if leftovers:
        logger.warning("%s holds %s, left by an interrupted write of %s: remove %s unless another process is writing "
                       "%s now", out.parent, ", ".join(leftovers), out.name,
                       "them" if len(leftovers) > 1 else "it", out.name)


def write_file_atomically(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())  # the text on disk before the name points at it: a power cut leaves old or new
        os.chmod(tmp, _default_mode(0o666))  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def ordinary_permissions(directory: Path) -> None:
    """Every file and directory under `directory` with the permissions a new one gets here (the umask's): some writers
    (safetensors) create 0600 files, and outputs are ordinary files."""
    for path in Path(directory).rglob("*"):
        path.chmod(_default_mode(0o777 if path.is_dir() else 0o666))


def save_figure_atomically(figure, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Save a matplotlib figure through a temporary sibling, so a crash never leaves a half-written PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)  # one per writer
    os.close(handle)
    try:
        figure.savefig(staging, dpi=dpi)
        os.chmod(staging, _default_mode(0o666))
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise
    return path


def _default_mode(full: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return full & ~umask
