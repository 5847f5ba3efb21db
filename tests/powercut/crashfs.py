"""A FUSE file system that forgets, at a simulated power cut, what was not fsynced.

Everything lives in this process's memory. Each file keeps two contents:
what processes see (every write so far) and what a power cut would leave
(the content as of its last fsync); each directory keeps two sets of
entries: the current ones and those as of its last fsync. Between the
two, the writes and the namespace operations (create, link, unlink,
rename, mkdir, rmdir) are kept in order.

At a cut, for every directory a seeded random prefix of its unsynced
operations survives (each operation whole: a rename is atomic), and for
every file that is still reachable a random prefix of its unsynced writes
survives, the last of them torn at a random byte. That is the strictest
reading of POSIX: a file's fsync makes its bytes durable and not its name;
a directory's fsync makes its entries durable and not the files' bytes. A
new file whose directory was never fsynced disappears; a name whose file
was never fsynced survives empty or torn.

Run as a process (``python crashfs.py MOUNTPOINT CONTROL_SOCKET``); the
control socket takes one line a connection and answers one JSON line:
``cut SEED`` (the power cut: every process writing here must be dead
first) and ``stats``. The mount has no attribute, entry or page cache that
outlives an open, so processes see the state after a cut at once.
"""

from __future__ import annotations

import errno
import json
import os
import random
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field

import mfusepy

_BLOCK = 4096


@dataclass
class Inode:
    number: int
    mode: int
    nlink: int = 0
    data: bytearray = field(default_factory=bytearray)  # a file's content as seen
    synced: bytearray = field(default_factory=bytearray)  # a file's content after a cut
    pending: list = field(default_factory=list)  # ("w", offset, bytes) | ("t", length) since its fsync
    entries: dict[str, int] = field(default_factory=dict)  # a directory's names as seen
    synced_entries: dict[str, int] = field(default_factory=dict)
    ops: list = field(default_factory=list)  # ("set", name, inode) | ("del", name) | ("mv", old, new, inode)
    mtime_ns: int = field(default_factory=time.time_ns)
    target: str = ""  # a symbolic link's

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def _apply_write(content: bytearray, op: tuple) -> None:
    if op[0] == "t":
        length = op[1]
        if length < len(content):
            del content[length:]
        else:
            content.extend(bytes(length - len(content)))
        return
    _, offset, data = op
    if offset > len(content):
        content.extend(bytes(offset - len(content)))
    content[offset : offset + len(data)] = data


def _apply_entry(entries: dict[str, int], op: tuple) -> None:
    if op[0] == "set":
        entries[op[1]] = op[2]
    elif op[0] == "mv":
        entries.pop(op[1], None)
        entries[op[2]] = op[3]
    else:
        entries.pop(op[1], None)


class CrashFS(mfusepy.Operations):
    use_ns = True

    def __init__(self) -> None:
        self.mutex = threading.RLock()
        self.inodes: dict[int, Inode] = {}
        self.next_number = 1
        self.handles: dict[int, int] = {}  # file handle -> inode number
        self.next_handle = 1
        self.unlinked = 0
        self.root = self._new(stat.S_IFDIR | 0o755).number
        self.inodes[self.root].nlink = 2
        self.totals = {"cuts": 0, "fsyncs": 0, "dir_fsyncs": 0, "writes_lost": 0, "writes_torn": 0, "names_lost": 0}

    # -- the model ---------------------------------------------------------

    def _new(self, mode: int) -> Inode:
        inode = Inode(self.next_number, mode)
        self.inodes[inode.number] = inode
        self.next_number += 1
        return inode

    def _lookup(self, path: str) -> Inode:
        inode = self.inodes[self.root]
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if not inode.is_dir:
                raise mfusepy.FuseOSError(errno.ENOTDIR)
            number = inode.entries.get(part)
            if number is None:
                raise mfusepy.FuseOSError(errno.ENOENT)
            inode = self.inodes[number]
        return inode

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise mfusepy.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _set(self, directory: Inode, name: str, number: int) -> None:
        directory.entries[name] = number
        directory.ops.append(("set", name, number))
        directory.mtime_ns = time.time_ns()

    def _del(self, directory: Inode, name: str) -> None:
        del directory.entries[name]
        directory.ops.append(("del", name))
        directory.mtime_ns = time.time_ns()

    def _handle(self, number: int) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = number
        return handle

    def _file(self, path: str | None, fh: int | None) -> Inode:
        if fh is not None and fh in self.handles:
            return self.inodes[self.handles[fh]]
        if path is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        return self._lookup(path)

    def _write(self, inode: Inode, op: tuple) -> None:
        _apply_write(inode.data, op)
        inode.pending.append(op)
        inode.mtime_ns = time.time_ns()

    def cut(self, seed: int, strict: bool = False) -> dict:
        """The power cut: only what was synced survives, plus (unless
        ``strict``) a random prefix of what was not, torn at its end."""
        rng = random.Random(seed)
        chance = 0.0 if strict else 0.5
        with self.mutex:
            before = {"names_lost": 0, "writes_lost": 0, "writes_torn": 0}
            for inode in self.inodes.values():
                if not inode.is_dir or not inode.ops:
                    continue
                kept = rng.randint(0, len(inode.ops)) if rng.random() < chance else 0
                for op in inode.ops[:kept]:
                    _apply_entry(inode.synced_entries, op)
                before["names_lost"] += len(inode.ops) - kept
            survivors: set[int] = set()
            links: dict[int, int] = {}
            stack = [self.root]
            while stack:
                number = stack.pop()
                if number in survivors:
                    links[number] = links.get(number, 0) + 1
                    continue
                survivors.add(number)
                links[number] = 1
                inode = self.inodes[number]
                if inode.is_dir:
                    stack.extend(inode.synced_entries.values())
            for number in sorted(survivors):
                inode = self.inodes[number]
                if inode.is_dir:
                    inode.entries = dict(inode.synced_entries)
                    inode.ops = []
                    inode.nlink = 2 + sum(1 for n in inode.entries.values() if self.inodes[n].is_dir)
                    continue
                inode.nlink = links[number]
                if inode.pending:
                    kept = rng.randint(0, len(inode.pending)) if rng.random() < chance else 0
                    for op in inode.pending[:kept]:
                        _apply_write(inode.synced, op)
                    if kept < len(inode.pending) and inode.pending[kept][0] == "w" and rng.random() < chance:
                        _, offset, data = inode.pending[kept]
                        _apply_write(inode.synced, ("w", offset, data[: rng.randrange(len(data) + 1)]))
                        before["writes_torn"] += 1
                    before["writes_lost"] += len(inode.pending) - kept
                inode.data = bytearray(inode.synced)
                inode.pending = []
            self.inodes = {n: i for n, i in self.inodes.items() if n in survivors}
            self.handles.clear()
            self.totals["cuts"] += 1
            for key, value in before.items():
                self.totals[key] += value
            return dict(before, files=sum(1 for i in self.inodes.values() if not i.is_dir))

    # -- FUSE operations -----------------------------------------------------

    def getattr(self, path, fh=None):
        with self.mutex:
            inode = self._file(path, fh)
            size = len(inode.target) if stat.S_ISLNK(inode.mode) else len(inode.data)
            return {
                "st_mode": inode.mode,
                "st_nlink": inode.nlink,
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_blksize": _BLOCK,
                "st_mtime": inode.mtime_ns,
                "st_ctime": inode.mtime_ns,
                "st_atime": inode.mtime_ns,
                "st_uid": os.getuid(),
                "st_gid": os.getgid(),
            }

    def readdir(self, path, fh):
        with self.mutex:
            return [".", "..", *self._lookup(path).entries]

    def mkdir(self, path, mode):
        with self.mutex:
            parent, name = self._parent(path)
            if name in parent.entries:
                raise mfusepy.FuseOSError(errno.EEXIST)
            inode = self._new(stat.S_IFDIR | (mode & 0o7777))
            inode.nlink = 2
            parent.nlink += 1
            self._set(parent, name, inode.number)
            return 0

    def rmdir(self, path):
        with self.mutex:
            parent, name = self._parent(path)
            inode = self._lookup(path)
            if not inode.is_dir:
                raise mfusepy.FuseOSError(errno.ENOTDIR)
            if inode.entries:
                raise mfusepy.FuseOSError(errno.ENOTEMPTY)
            self._del(parent, name)
            parent.nlink -= 1
            return 0

    def create(self, path, mode, flags=0):
        with self.mutex:
            parent, name = self._parent(path)
            number = parent.entries.get(name)
            if number is None:
                inode = self._new(stat.S_IFREG | (mode & 0o7777))
                inode.nlink = 1
                self._set(parent, name, inode.number)
                number = inode.number
            elif flags & os.O_EXCL:
                raise mfusepy.FuseOSError(errno.EEXIST)
            return self._handle(number)

    def open(self, path, flags):
        with self.mutex:
            return self._handle(self._lookup(path).number)

    def release(self, path, fh):
        with self.mutex:
            self.handles.pop(fh, None)
            return 0

    def opendir(self, path):
        return 0

    def releasedir(self, path, fh):
        return 0

    def flush(self, path, fh):
        return 0

    def read(self, path, size, offset, fh):
        with self.mutex:
            return bytes(self._file(path, fh).data[offset : offset + size])

    def write(self, path, data, offset, fh):
        with self.mutex:
            self._write(self._file(path, fh), ("w", offset, bytes(data)))
            return len(data)

    def truncate(self, path, length, fh=None):
        with self.mutex:
            self._write(self._file(path, fh), ("t", length))
            return 0

    def fallocate(self, path, mode, offset, length, fh):
        with self.mutex:
            inode = self._file(path, fh)
            if mode == 0 and offset + length > len(inode.data):
                self._write(inode, ("t", offset + length))
            return 0

    def fsync(self, path, datasync, fh):
        with self.mutex:
            inode = self._file(path, fh)
            if inode.is_dir:
                return self.fsyncdir(path, datasync, fh)
            for op in inode.pending:
                _apply_write(inode.synced, op)
            inode.pending = []
            self.totals["fsyncs"] += 1
            return 0

    def fsyncdir(self, path, datasync, fh):
        with self.mutex:
            inode = self._lookup(path)
            for op in inode.ops:
                _apply_entry(inode.synced_entries, op)
            inode.ops = []
            self.totals["dir_fsyncs"] += 1
            return 0

    def unlink(self, path):
        with self.mutex:
            parent, name = self._parent(path)
            inode = self._lookup(path)
            if inode.is_dir:
                raise mfusepy.FuseOSError(errno.EISDIR)
            self._del(parent, name)
            inode.nlink -= 1
            self.unlinked += 1
            if self.unlinked % 2000 == 0:
                self._collect()
            return 0

    def _collect(self) -> None:
        """Forget the files no name, no handle and no surviving name can
        bring back (removed WAL segments, vacuumed data files)."""
        kept = {self.root, *self.handles.values()}
        for inode in self.inodes.values():
            if inode.is_dir:
                kept.update(inode.entries.values())
                kept.update(inode.synced_entries.values())
                kept.update(op[-1] for op in inode.ops if op[0] != "del")
        self.inodes = {n: i for n, i in self.inodes.items() if n in kept}

    def link(self, target, source):
        with self.mutex:
            inode = self._lookup(source)
            parent, name = self._parent(target)
            if name in parent.entries:
                raise mfusepy.FuseOSError(errno.EEXIST)
            inode.nlink += 1
            self._set(parent, name, inode.number)
            return 0

    def symlink(self, target, source):
        with self.mutex:
            parent, name = self._parent(target)
            if name in parent.entries:
                raise mfusepy.FuseOSError(errno.EEXIST)
            inode = self._new(stat.S_IFLNK | 0o777)
            inode.target = source
            inode.nlink = 1
            self._set(parent, name, inode.number)
            return 0

    def readlink(self, path):
        with self.mutex:
            return self._lookup(path).target

    def rename(self, old, new, flags=0):
        with self.mutex:
            old_parent, old_name = self._parent(old)
            new_parent, new_name = self._parent(new)
            inode = self._lookup(old)
            replaced = new_parent.entries.get(new_name)
            if replaced is not None:
                if flags & 1:  # RENAME_NOREPLACE
                    raise mfusepy.FuseOSError(errno.EEXIST)
                if self.inodes[replaced].is_dir and self.inodes[replaced].entries:
                    raise mfusepy.FuseOSError(errno.ENOTEMPTY)
                self.inodes[replaced].nlink -= 1
            if flags & ~1:
                raise mfusepy.FuseOSError(errno.EINVAL)
            if old_parent is new_parent:
                # One operation in one directory: atomic at a cut.
                del old_parent.entries[old_name]
                new_parent.entries[new_name] = inode.number
                old_parent.ops.append(("mv", old_name, new_name, inode.number))
            else:
                self._del(old_parent, old_name)
                self._set(new_parent, new_name, inode.number)
                if inode.is_dir:
                    old_parent.nlink -= 1
                    new_parent.nlink += 1
            return 0

    def chmod(self, path, mode):
        with self.mutex:
            inode = self._lookup(path)
            inode.mode = stat.S_IFMT(inode.mode) | (mode & 0o7777)
            return 0

    def chown(self, path, uid, gid):
        return 0

    def utimens(self, path, times=None):
        with self.mutex:
            inode = self._lookup(path)
            inode.mtime_ns = times[1] if times else time.time_ns()
            return 0

    def access(self, path, amode):
        with self.mutex:
            self._lookup(path)
            return 0

    def statfs(self, path):
        blocks = 1 << 26  # 256 GiB of 4 KiB blocks, all free
        return {
            "f_bsize": _BLOCK,
            "f_frsize": _BLOCK,
            "f_blocks": blocks,
            "f_bfree": blocks,
            "f_bavail": blocks,
            "f_files": 1 << 20,
            "f_ffree": 1 << 20,
            "f_namemax": 255,
        }


class _Fuse(mfusepy.FUSE):
    """Passes rename's flags on (RENAME_NOREPLACE is how a Delta commit
    claims its version on a local disk); mfusepy drops them."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(old.decode(), new.decode(), flags)


def _serve_control(fs: CrashFS, path: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    while True:
        connection, _ = server.accept()
        with connection:
            line = connection.makefile("r").readline().split()
            if not line:
                continue
            if line[0] == "cut":
                answer = fs.cut(int(line[1]), strict="strict" in line[2:])
            else:
                with fs.mutex:
                    answer = dict(fs.totals, files=sum(1 for i in fs.inodes.values() if not i.is_dir))
            connection.sendall((json.dumps(answer) + "\n").encode())


def main(argv: list[str]) -> int:
    mountpoint, control = argv[1], argv[2]
    fs = CrashFS()
    threading.Thread(target=_serve_control, args=(fs, control), daemon=True).start()
    _Fuse(
        fs,
        mountpoint,
        foreground=True,
        fsname="crashfs",
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
