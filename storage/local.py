"""The local-filesystem backend: plain files under a table root, with atomic put-if-absent.

Put-if-absent writes a temp file next to the target and publishes it with `link(2)`, which
fails with EEXIST when the name is taken. Filesystems that refuse hard links get
`renameat2(RENAME_NOREPLACE)` (Linux) instead; with neither, the call raises rather than
loop or fall back to a racy check-then-write. Files and their directories are fsynced
unless the backend is built with `fsync=False` (tests, scratch tables).
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import datetime
import errno
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from deltacoord.storage.backend import Data, ObjectInfo, ObjectNotFoundError, ObjectWriter
from deltacoord.storage.uri import StorageError

#: Temp files this backend creates start with this; listings skip them.
TMP_PREFIX = ".deltacoord-tmp-"
#: Threads that fsync a batch's temp files at once (os.fsync releases the GIL; the journal merges them).
_FSYNC_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="deltacoord-fsync")


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
#: errnos with which a filesystem says "no hard links here".
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV, errno.EACCES})
#: errnos with which renameat2 says "this filesystem or kernel cannot do RENAME_NOREPLACE".
_NO_NOREPLACE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


class AtomicPutUnsupportedError(StorageError):
    """The filesystem offers neither hard links nor RENAME_NOREPLACE, so put-if-absent cannot be atomic.

    `link_errno` is the errno with which link(2) was refused.
    """

    def __init__(self, message: str, link_errno: int = 0) -> None:
        super().__init__(message)
        self.link_errno = link_errno


def _load_renameat2() -> Callable[[str, str], None] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def rename_noreplace(src: str, dst: str) -> None:
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), dst)

    return rename_noreplace


_renameat2 = _load_renameat2()


def rename_noreplace(src: str, dst: str) -> None:
    """Rename `src` to `dst` unless `dst` exists (FileExistsError); OSError(ENOSYS) without renameat2."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available in this C library", dst)
    _renameat2(src, dst)


def hard_link(src: str, dst: str) -> None:
    """`os.link`, a seam so tests can play a filesystem without hard links."""
    os.link(src, dst)


class LocalBackend:
    """Objects as files below `root` (an absolute, normalised path)."""

    def __init__(self, root: str, *, fsync: bool = True) -> None:
        self.root = root
        self.fsync = fsync

    @property
    def local_root(self) -> str | None:
        return self.root

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    # -- durability helpers ------------------------------------------------------------------------
    def _fsync_dir(self, directory: str) -> None:
        if not self.fsync:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _makedirs(self, directory: str) -> None:
        """Create missing directories; fsync each new one's parent so the entry survives a crash."""
        missing: builtins.list[str] = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d)
            self._fsync_dir(os.path.dirname(d))

    def _write_temp(self, final: str, data: bytes | bytearray | memoryview) -> str:
        directory = os.path.dirname(final)
        self._makedirs(directory)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    # -- operations --------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        try:
            with open(self.path(key), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} under {self.root}") from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with open(self.path(key), "rb") as fh:
                fh.seek(start)
                return fh.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} under {self.root}") from e

    def open_input(self, key: str) -> BinaryIO:
        try:
            return open(self.path(key), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} under {self.root}") from e

    def parquet_source(self, key: str, size: int | None) -> Any:
        """The file's path: Arrow's own reader opens it."""
        return self.path(key)

    def head(self, key: str) -> ObjectInfo:
        try:
            st = os.stat(self.path(key))
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"no object {key!r} under {self.root}") from e
        if not os.path.isfile(self.path(key)):
            raise ObjectNotFoundError(f"{key!r} under {self.root} is a directory, not an object")
        return ObjectInfo(key, st.st_size, datetime.datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=datetime.UTC))

    def put(self, key: str, data: Data) -> None:
        final = self.path(key)
        tmp = self._write_temp(final, data)
        try:
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fsync_dir(os.path.dirname(final))

    def open_output(self, key: str) -> ObjectWriter:
        """A temp file next to the target, fsynced and renamed into place when it closes."""
        tmp = self.temp_for(key)
        fh = open(tmp, "xb")  # noqa: SIM115 - closed by the writer's publish or discard

        def publish() -> None:
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())
            fh.close()
            self.put_file(key, tmp)

        def discard() -> None:
            fh.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

        return ObjectWriter(fh, publish, discard)

    def put_file(self, key: str, tmp: str) -> None:
        """Publish an already written temp file (in the target's directory) over `key`."""
        final = self.path(key)
        os.replace(tmp, final)
        self._fsync_dir(os.path.dirname(final))

    def temp_for(self, key: str) -> str:
        final = self.path(key)
        self._makedirs(os.path.dirname(final))
        return os.path.join(os.path.dirname(final), f"{TMP_PREFIX}{uuid.uuid4().hex}")

    def put_if_absent(self, key: str, data: Data) -> bool:
        final = self.path(key)
        if os.path.lexists(final):
            return False
        tmp = self._write_temp(final, data)
        try:
            return self._publish_if_absent(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> builtins.list[bool]:
        """`put_if_absent` of several objects in one directory, in order, with one flush for all of them.

        The temp files are written first and fsynced together (their fsyncs overlap, and the journal merges
        them), then linked in order, then the directory is fsynced once: a batch of log versions costs
        about what one does. Linking stops at the first key that is taken (its result is False and the
        later ones are not attempted: the caller decides what a taken name means), so the result may be
        shorter than `items`.
        """
        if not items:
            return []
        finals = [self.path(key) for key, _ in items]
        directory = os.path.dirname(finals[0])
        if any(os.path.dirname(f) != directory for f in finals):
            raise ValueError("put_many_if_absent takes keys of one directory")
        self._makedirs(directory)
        temps: builtins.list[str] = []
        try:
            for _key, data in items:
                temps.append(self._write_temp_unsynced(directory, data))
            if self.fsync:
                for _ in _FSYNC_POOL.map(_fsync_path, temps):
                    pass
            results: builtins.list[bool] = []
            for tmp, final in zip(temps, finals, strict=True):
                created = not os.path.lexists(final) and self._link_if_absent(tmp, final)
                results.append(created)
                if not created:
                    break
            if any(results):
                self._fsync_dir(directory)
            return results
        finally:
            for tmp in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    def _write_temp_unsynced(self, directory: str, data: bytes | bytearray | memoryview) -> str:
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def put_file_if_absent(self, key: str, tmp: str) -> bool:
        """Give the already written file `tmp` (in the target's directory) the name `key` unless it is taken.

        `tmp` stays where it is; the caller removes it (after a successful link both names are the file).
        """
        final = self.path(key)
        if os.path.lexists(final):
            return False
        if self.fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return self._publish_if_absent(tmp, final)

    def _publish_if_absent(self, tmp: str, final: str) -> bool:
        if not self._link_if_absent(tmp, final):
            return False
        self._fsync_dir(os.path.dirname(final))
        return True

    def _link_if_absent(self, tmp: str, final: str) -> bool:
        """Give `tmp` the name `final` unless it is taken (no fsync of the directory)."""
        try:
            hard_link(tmp, final)
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in _NO_LINKS:
                raise
            try:
                rename_noreplace(tmp, final)
            except FileExistsError:
                return False
            except OSError as e2:
                if e2.errno in _NO_NOREPLACE:
                    raise AtomicPutUnsupportedError(
                        f"the filesystem under {self.root} cannot do an atomic put-if-absent: hard links are refused "
                        f"({os.strerror(e.errno or 0)}) and renameat2(RENAME_NOREPLACE) is not supported "
                        f"({os.strerror(e2.errno or 0)}); put the table on a filesystem that supports either",
                        e.errno or 0,
                    ) from e2
                raise
        return True

    def list_names(self, prefix: str, start_after: str | None) -> builtins.list[str]:
        """Keys of the files directly in the directory `prefix` (no stat, no recursion), sorted."""
        base = self.path(prefix) if prefix else self.root
        rel_base = f"{prefix}/" if prefix else ""
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for entry in entries:
            if entry.name.startswith(TMP_PREFIX) or entry.is_dir():
                continue
            key = rel_base + entry.name
            if start_after is None or key > start_after:
                out.append(key)
        out.sort()
        return out

    def list_keys(self, prefix: str, start_after: str | None) -> builtins.list[tuple[str, datetime.datetime | None]]:
        """Read without a stat per file: the time is None."""
        return [(k, None) for k in self.list_names(prefix, start_after)]

    def list(self, prefix: str, start_after: str | None) -> builtins.list[ObjectInfo]:
        """Every file below `prefix`, skipping our temp files."""
        base = self.path(prefix) if prefix else self.root
        out: builtins.list[ObjectInfo] = []
        rel_base = f"{prefix}/" if prefix else ""

        def walk(directory: str, rel: str) -> None:
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                return
            for entry in entries:
                if entry.name.startswith(TMP_PREFIX):
                    continue
                key = rel + entry.name
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, key + "/")
                elif entry.is_file():
                    if start_after is not None and key <= start_after:
                        continue
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    out.append(ObjectInfo(key, st.st_size,
                                          datetime.datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=datetime.UTC)))

        walk(base, rel_base)
        out.sort(key=lambda o: o.key)
        return out

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(key))
