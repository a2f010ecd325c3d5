"""Bounded streams between the relay's event loop and the threads that talk to Docker, and the tar pieces.

The docker SDK blocks, so a transfer runs its Docker side on a worker thread.
``ThreadChunks`` carries what that thread produces to the event loop at most
``depth`` chunks ahead (a slow client slows Docker down instead of filling
memory); ``loop_chunks`` hands the event loop's request body to the thread the
same way, one chunk at a time. ``file_from_tar`` unpacks the one file Docker's
archive API sends, ``tar_of_one_file`` packs an upload on the fly: neither ever
holds more than a chunk.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

from scheduler.errors import InvalidInput

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
    """From Docker's tar stream of one path: first its TarInfo (a regular file), then its bytes, chunk by chunk."""
    archive = tarfile.open(fileobj=_Reader(chunks), mode="r|", bufsize=CHUNK)
    member = archive.next()
    if member is None or not member.isreg():
        raise InvalidInput("not a regular file", field="path")
    yield member
    body = archive.extractfile(member)
    while block := body.read(CHUNK):
        yield block


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


class _Reader(io.RawIOBase):
    """A file object over an iterator of byte chunks, for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._buffer = memoryview(b"")

    def readable(self):
        return True

    def readinto(self, target):
        while not self._buffer:
            try:
                self._buffer = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n
