"""Bounded streams between the relay's event loop and the threads that talk to Docker, and the tar pieces.

The docker SDK blocks, so a transfer runs its Docker side on a worker thread.
``ThreadChunks`` carries what that thread produces to the event loop at most
``depth`` chunks ahead (a slow client slows Docker down instead of filling
memory); ``loop_chunks`` hands the event loop's request body to the thread the
same way, one chunk at a time. ``file_from_tar`` unpacks the one file Docker's
archive API sends, ``tar_of_one_file`` packs an upload on the fly: neither ever
holds more than a chunk. (tarfile's own stream mode copies every byte several
times: it cost six times the CPU of the rest of a download.)
"""

from __future__ import annotations

import asyncio
import tarfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

from core.errors import InvalidInput

CHUNK = 1024 * 1024
BLOCK = tarfile.BLOCKSIZE
_END = object()


class ThreadChunks:
    """Items a blocking iterable yields on a worker thread, as an async iterator, at most ``depth`` ahead.

    ``close()`` (always call it) makes the thread stop at its next item and close the iterable.
    """

    def __init__(self, depth: int = 4):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._room = threading.Semaphore(depth)
        self._closed = threading.Event()

    def produce(self, iterable: Iterable) -> None:
        """Runs on the worker thread."""
        iterator = iter(iterable)
        try:
            for item in iterator:
                while not self._room.acquire(timeout=0.5):
                    if self._closed.is_set():
                        return
                if self._closed.is_set():
                    return
                self._put(item)
            self._put(_END)
        except BaseException as exc:  # handed to the event loop, raised there
            self._put(exc)
        finally:
            getattr(iterator, "close", lambda: None)()

    def _put(self, item) -> None:
        if not self._closed.is_set():
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self._queue.get()
        self._room.release()
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._closed.set()


def loop_chunks(
    loop: asyncio.AbstractEventLoop, read: Callable[[], Awaitable[bytes]], *, idle_s: float
) -> Iterator[bytes]:
    """On a worker thread: the chunks ``read()`` gives on the event loop, until it gives b"" (the end)."""
    while chunk := asyncio.run_coroutine_threadsafe(read(), loop).result(idle_s):
        yield chunk


def file_from_tar(chunks: Iterable[bytes]) -> Iterator:
    """From Docker's tar stream of one path: first its TarInfo (a regular file), then its bytes, chunk by chunk.

    The file's bytes are the chunks' own, gathered into pieces of about CHUNK; headers are read with
    tarfile's own parser. Extended headers (PAX, GNU long names) before the member are read for its size, then skipped.
    """
    blocks = _Blocks(chunks)
    size = None
    while True:
        header = blocks.exactly(BLOCK)
        if len(header) < BLOCK or not header.strip(b"\0"):
            raise InvalidInput("the archive holds no file", field="path")
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise InvalidInput(f"an unreadable archive: {exc}", field="path") from exc
        if info.type not in EXTENSION_HEADERS:
            break
        payload = blocks.exactly(info.size + (-info.size % BLOCK))
        if info.type == tarfile.XHDTYPE:
            size = _pax_size(payload[: info.size]) or size
    if size is not None:
        info.size = size
    if not info.isreg():
        raise InvalidInput("not a regular file", field="path")
    yield info
    yield from blocks.take(info.size)


EXTENSION_HEADERS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, *tarfile.GNU_TYPES)


def _pax_size(records: bytes) -> int | None:
    """The ``size`` record of a PAX extended header ("<length> size=<n>\\n"), if it has one."""
    for record in records.split(b"\n"):
        _, _, field = record.partition(b" ")
        key, _, value = field.partition(b"=")
        if key == b"size" and value.isdigit():
            return int(value)
    return None


class _Blocks:
    """Reads exact lengths from an iterator of byte chunks, keeping what is left of the current one."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._rest = memoryview(b"")

    def _more(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._rest = memoryview(chunk)
                return True
        return False

    def exactly(self, n: int) -> bytes:
        """``n`` bytes, fewer only at the end of the stream."""
        parts = []
        while n and (self._rest or self._more()):
            part, self._rest = self._rest[:n], self._rest[n:]
            parts.append(part)
            n -= len(part)
        return b"".join(parts)

    def take(self, n: int) -> Iterator[bytes]:
        """``n`` bytes in pieces of about CHUNK (fewer, larger writes downstream); InvalidInput if it ends early."""
        parts, held = [], 0
        while n:
            if not self._rest and not self._more():
                raise InvalidInput("the archive ended early", field="path")
            part, self._rest = self._rest[:n], self._rest[n:]
            n -= len(part)
            parts.append(part)
            held += len(part)
            if held >= CHUNK or not n:
                yield b"".join(parts)
                parts, held = [], 0


def tar_of_one_file(name: str, size: int, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A tar archive holding one file ``name`` of ``size`` bytes whose data are ``chunks``, made as it is read."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    sent = 0
    for chunk in chunks:
        sent += len(chunk)
        if sent > size:
            raise InvalidInput(f"the upload is longer than the {size} bytes announced", field="file")
        yield chunk
    if sent != size:
        raise InvalidInput(f"the upload ended after {sent} of {size} bytes", field="file")
    yield b"\0" * (-size % BLOCK) + b"\0" * (2 * BLOCK)  # padding, then the end-of-archive marker
