"""Writing a file a command was asked to write, without destroying one or lying about it.

Every rmqkit command that writes a file goes through ``SafeOutput``:

- **No silent overwrite.** An existing file is refused (``OutputMode.CREATE``, the default)
  unless the caller asked to replace it (``FORCE``) or to add to it (``APPEND``).
- **No half-written file under the name asked for.** ``CREATE`` and ``FORCE`` write to a
  temporary file beside the target and move it into place only when it is complete and
  fsynced (the directory is fsynced too, so the name survives a power loss). An error or an
  interrupt removes the temporary file and leaves any earlier file untouched.
- **Durable means durable.** ``sync(publish=True)`` writes, fsyncs and puts the file in place
  under its name; only after it returns may a caller act on the lines written so far (an
  export that removes messages acks them then). Once published, a later write error truncates
  the file back to the last synced byte, so it holds complete lines only, each of them durable.
- **One error for the operator.** Any ``OSError`` while writing (disk full, a file size limit,
  a vanished directory) becomes ``OutputError`` (exit 74, sysexits' EX_IOERR) naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from rmqkit.errors import OutputError, UsageError

_WRITE_THROUGH = 1 << 20  # buffered bytes written out (not fsynced) once past this


class OutputMode(StrEnum):
    """What to do when the file already exists."""

    CREATE = "create"  # refuse an existing file
    FORCE = "force"  # replace it, atomically, once the new one is complete
    APPEND = "append"  # add complete lines to its end


def output_mode(*, force: bool, append: bool) -> OutputMode:
    """The mode for a command's ``--force`` / ``--append`` flags (both at once: exit 64)."""
    if force and append:
        raise UsageError("give --force (replace the file) or --append (add to it), not both")
    return OutputMode.FORCE if force else OutputMode.APPEND if append else OutputMode.CREATE


def check_output(path: Path, mode: OutputMode) -> None:
    """Refuse early, before any other work, what ``SafeOutput.open`` would refuse."""
    if str(path) == "-":
        # "-" is stdout to a shell user (and `--ids-from -` reads stdin): never a file named
        # "-" in the working directory, and a file is what the whole-or-nothing write needs.
        raise UsageError(
            "-o -: output goes to a file (written whole, fsynced, then renamed), not to "
            "stdout — give a file name"
        )
    if path.is_dir():
        raise UsageError(f"{path} is a directory — give a file name")
    if mode is OutputMode.CREATE and (path.exists() or path.is_symlink()):
        raise UsageError(
            f"{path} exists — pass --force to replace it or --append to add to it "
            "(nothing was done)"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: directory {parent} does not exist")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class SafeOutput:
    """One output file; see the module docstring. Use as a context manager or call
    ``open`` / ``commit`` / ``abandon`` yourself (``abandon`` is safe to call after anything).
    """

    def __init__(self, path: Path, mode: OutputMode = OutputMode.CREATE) -> None:
        self.path = path
        self.mode = mode
        self.published = False  # the file is under its own name
        self.durable_bytes = 0  # bytes of it fsynced (what a crash or error leaves)
        self._fd: int | None = None
        self._tmp: Path | None = None
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._written = 0  # bytes written to the fd so far (the file's size)

    # --- lifecycle ---------------------------------------------------------------------
    def open(self) -> SafeOutput:
        """Create the temporary file (or open the file to append to)."""
        check_output(self.path, self.mode)
        parent = self.path.parent if str(self.path.parent) else Path(".")
        try:
            if self.mode is OutputMode.APPEND:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                self._fd = fd
                size = os.fstat(fd).st_size
                if size and not _ends_with_newline(self.path, size):
                    raise OutputError(
                        f"{self.path} ends with an incomplete line (an interrupted write?) — "
                        "remove the partial last line before appending to it"
                    )
                self._written = self.durable_bytes = size
                self.published = True
                _fsync_dir(parent)  # the name may be new: make it durable before any ack
                return self
            fd, name = tempfile.mkstemp(dir=parent, prefix=f".{self.path.name}.", suffix=".tmp")
            self._fd, self._tmp = fd, Path(name)
            os.fchmod(fd, self._final_mode())
        except OSError as exc:
            self.abandon()
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        return self

    def _final_mode(self) -> int:
        with contextlib.suppress(OSError):
            if self.mode is OutputMode.FORCE and self.path.exists():
                return self.path.stat().st_mode & 0o7777
        return _default_mode()

    def __enter__(self) -> SafeOutput:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abandon()

    # --- writing -----------------------------------------------------------------------
    def write(self, text: str) -> None:
        """Add ``text``; it reaches the file by the next ``sync`` (or sooner, not fsynced)."""
        data = text.encode("utf-8")
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered >= _WRITE_THROUGH:
            self._write_out()

    def sync(self, *, publish: bool = False) -> None:
        """Write what is buffered and fsync it; with ``publish`` also put the file in place
        under its name (and fsync the directory). Raises OutputError, having truncated a
        published file back to its last durable byte."""
        self._write_out()
        try:
            assert self._fd is not None
            os.fsync(self._fd)
            if publish and not self.published:
                self._publish()
        except OSError as exc:
            self._fail(exc)
        self.durable_bytes = self._written

    def commit(self) -> None:
        """Finish: everything written is durable and under the file's name."""
        self.sync(publish=True)
        self._close()

    def abandon(self) -> None:
        """Stop after an error or interrupt: an unpublished temporary file is removed (an
        earlier file of that name is untouched); a published one keeps its durable bytes."""
        self._buffer, self._buffered = [], 0
        if self._fd is not None and self.published:
            with contextlib.suppress(OSError):
                if self._written > self.durable_bytes:
                    os.ftruncate(self._fd, self.durable_bytes)
                    os.fsync(self._fd)
        self._close()

    # --- internals ---------------------------------------------------------------------
    def _write_out(self) -> None:
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        self._buffer, self._buffered = [], 0
        view = memoryview(data)
        assert self._fd is not None
        try:
            while view:  # os.write may write less than asked (a size limit reached midway)
                n = os.write(self._fd, view)
                self._written += n
                view = view[n:]
        except OSError as exc:
            self._fail(exc)

    def _publish(self) -> None:
        assert self._tmp is not None
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if self.mode is OutputMode.FORCE:
            os.replace(self._tmp, self.path)
        else:
            try:  # a hard link never replaces: a file created meanwhile is not overwritten
                os.link(self._tmp, self.path)
            except FileExistsError:
                raise OSError(
                    errno.EEXIST, "the file was created by someone else meanwhile"
                ) from None
            except OSError:  # a file system without hard links
                if self.path.exists():
                    raise
                os.rename(self._tmp, self.path)
            else:
                os.unlink(self._tmp)
        self._tmp = None
        self.published = True
        _fsync_dir(parent)

    def _fail(self, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        self.abandon()
        raise OutputError(f"writing {self.path} failed: {reason}") from None

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.unlink()
            self._tmp = None


def _ends_with_newline(path: Path, size: int) -> bool:
    with path.open("rb") as handle:
        handle.seek(size - 1)
        return handle.read(1) == b"\n"


def write_file(path: Path, text: str, mode: OutputMode = OutputMode.CREATE) -> None:
    """Write ``text`` to ``path`` whole or not at all (see ``SafeOutput``)."""
    with SafeOutput(path, mode) as out:
        out.write(text)


__all__ = [
    "OutputError",
    "OutputMode",
    "SafeOutput",
    "check_output",
    "output_mode",
    "write_file",
]
