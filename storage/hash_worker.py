"""The put path's message hashes, computed in a worker process.

Three SHA-256 a message (the message hash, the MUID and the legacy
digest) over a ~1 KiB payload are the largest per-message cost of a put,
and the interpreter lock serialises them with everything else the node
process runs (the commits' Spark Connect calls, the readers). hashlib
releases that lock only for inputs of 2 KiB and more. So a batch's hash
inputs travel to a small child process, which does nothing but hash, in
one pipe write (lengths and bytes, no object per message); its answer
comes back as buffers that become Arrow columns without an object per
message. While it hashes, the node's threads run.

The child imports nothing beyond the standard library (about 10 MB). It
reads its requests from stdin until end of file, so it ends with the node
however the node ends (a kill -9 included). Any failure (the child died,
a short read) makes :meth:`BatchHasher.hash` return None; the caller then
hashes in process, and the next batch starts a new child.

Wire format, all integers little-endian:

- request: ``u32 count, u64 body size``, then ``count`` u32 lengths for
  each of pubsub topic, payload, content topic and meta, ``count`` i64
  sender timestamps, then each message's four fields back to back;
- answer: ``u32 count, u64 MUID bytes``, then ``count`` 32-byte message
  hashes, ``count`` 32-byte digests, ``count`` u32 MUID lengths and the
  MUIDs back to back.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import struct
import subprocess
import sys
import threading
from array import array
from itertools import chain

log = logging.getLogger(__name__)

# MUID = sha256(...) || meta[:32] (protocols.message: MUID_MAX_SIZE - HASH_SIZE).
MUID_META_PART = 32
_HEAD = struct.Struct("<IQ")
_STAMP = struct.Struct(">q")

# Below this many messages a batch is hashed in process: the round trip
# costs more than it saves.
MIN_BATCH = 64


# A batch hashes in milliseconds; a worker silent this long (stopped,
# starved) is given up and replaced, and the batch hashed in process.
TIMEOUT_S = 30.0


def _ready(fd: int, write: bool, timeout_s: float | None) -> None:
    if timeout_s is None:
        return
    readable, writable, _ = select.select([] if write else [fd], [fd] if write else [], [], timeout_s)
    if not (writable if write else readable):
        raise TimeoutError(f"the hash worker did not answer within {timeout_s} s")


def _read_exact(fd: int, size: int, timeout_s: float | None = None) -> bytes:
    chunks = []
    while size:
        _ready(fd, False, timeout_s)
        chunk = os.read(fd, min(size, 1 << 24))
        if not chunk:
            raise EOFError("the hash worker's pipe closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_into(fd: int, view: memoryview) -> None:
    """Fill ``view`` from ``fd`` (the child: no copy of a request)."""
    got = 0
    while got < len(view):
        read = os.readv(fd, [view[got:]])
        if not read:
            raise EOFError("the hash worker's pipe closed")
        got += read


def _write_all(fd: int, parts: list, timeout_s: float | None = None) -> None:
    """Write the buffers ``parts`` in order, without joining them."""
    parts = [memoryview(p).cast("B") for p in parts if len(p)]
    while parts:
        _ready(fd, True, timeout_s)
        written = os.writev(fd, parts[:512])
        while parts and written >= len(parts[0]):
            written -= len(parts[0])
            parts.pop(0)
        if written:
            parts[0] = parts[0][written:]


def serve(infd: int, outfd: int) -> None:
    """The child's loop: answer requests until end of input."""
    sha = hashlib.sha256
    stamp = _STAMP.pack
    buffer = bytearray()  # the largest request so far, reused
    while True:
        try:
            count, size = _HEAD.unpack(_read_exact(infd, _HEAD.size))
        except EOFError:
            return
        if len(buffer) < size:
            buffer = bytearray(size)
        body = memoryview(buffer)[:size]
        _read_into(infd, body)
        lengths = array("I")
        lengths.frombytes(body[: 16 * count])
        sender = array("q")
        sender.frombytes(body[16 * count : 24 * count])
        if sys.byteorder != "little":
            lengths.byteswap()
            sender.byteswap()
        offset = 24 * count
        hashes, digests, muids = [], [], []
        muid_lengths = array("I")
        for i in range(count):
            pubsub_end = offset + lengths[i]
            payload_end = pubsub_end + lengths[count + i]
            content_end = payload_end + lengths[2 * count + i]
            meta_end = content_end + lengths[3 * count + i]
            pubsub, payload = body[offset:pubsub_end], body[pubsub_end:payload_end]
            content, meta = body[payload_end:content_end], body[content_end:meta_end]
            offset = meta_end
            hashes.append(sha(b"".join((pubsub, payload, content, meta, stamp(sender[i])))).digest())
            digests.append(sha(b"".join((content, payload))).digest())
            muid = sha(b"".join((pubsub, content, meta, payload))).digest() + bytes(meta[:MUID_META_PART])
            muids.append(muid)
            muid_lengths.append(len(muid))
        if sys.byteorder != "little":
            muid_lengths.byteswap()
        muid_bytes = b"".join(muids)
        _write_all(
            outfd,
            [
                _HEAD.pack(count, len(muid_bytes)),
                b"".join(hashes),
                b"".join(digests),
                muid_lengths.tobytes(),
                muid_bytes,
            ],
        )
        del hashes, digests, muids, muid_bytes, body


def _widen(fd: int) -> None:
    """A 1 MiB pipe instead of 64 KiB: a batch crosses in fewer system
    calls (Linux; elsewhere, or past the system's limit, it stays)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass


class BatchHasher:
    """A hashing child process, started on first use. Thread-safe (one
    batch at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self.batches = 0
        self.failures = 0

    def hash(
        self, pubsub: list[bytes], payload: list[bytes], content: list[bytes], meta: list[bytes], sender: list[int]
    ) -> tuple[bytes, bytes, array, bytes] | None:
        """(message hashes, digests: 32 bytes each back to back; MUID
        lengths; MUIDs back to back) of the messages given as columns, or
        None when the child could not answer (hash in process then)."""
        count = len(payload)
        lengths = array("I", map(len, pubsub))
        for column in (payload, content, meta):
            lengths.extend(map(len, column))
        stamps = array("q", sender)
        if sys.byteorder != "little":
            lengths.byteswap()
            stamps.byteswap()
        fields = b"".join(chain.from_iterable(zip(pubsub, payload, content, meta)))
        request = [_HEAD.pack(count, 24 * count + len(fields)), lengths.tobytes(), stamps.tobytes(), fields]
        with self._lock:
            try:
                process = self._started()
                stdin, stdout = process.stdin, process.stdout
                assert stdin is not None and stdout is not None  # _started() opens both as pipes
                _write_all(stdin.fileno(), request, TIMEOUT_S)
                answered, muid_size = _HEAD.unpack(_read_exact(stdout.fileno(), _HEAD.size, TIMEOUT_S))
                if answered != count:
                    raise EOFError(f"the hash worker answered {answered} of {count} messages")
                body = _read_exact(stdout.fileno(), 68 * count + muid_size, TIMEOUT_S)
            except (OSError, EOFError, ValueError) as exc:
                self.failures += 1
                log.warning("hash worker failed (%s): hashing in process", exc)
                self._stop_locked()
                return None
            self.batches += 1
        muid_lengths = array("I")
        muid_lengths.frombytes(body[64 * count : 68 * count])
        if sys.byteorder != "little":
            muid_lengths.byteswap()
        return body[: 32 * count], body[32 * count : 64 * count], muid_lengths, body[68 * count :]

    def close(self) -> None:
        with self._lock:
            self._stop_locked()

    def _started(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD, os.path.dirname(os.path.abspath(__file__))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                close_fds=True,
            )
            for pipe in (self._process.stdin, self._process.stdout):
                assert pipe is not None  # stdin=PIPE, stdout=PIPE
                _widen(pipe.fileno())
        return self._process

    def _stop_locked(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        for pipe in (process.stdin, process.stdout):
            assert pipe is not None  # _started() opens both as pipes
            try:
                pipe.close()
            except OSError:
                pass
        try:
            process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# The child runs this file's serve() without importing the package (and
# with it pyarrow): only the standard library is loaded.
_CHILD = (
    "import importlib.util, os, sys\n"
    "spec = importlib.util.spec_from_file_location('hash_worker', os.path.join(sys.argv[1], 'hash_worker.py'))\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module.serve(0, 1)\n"
)
