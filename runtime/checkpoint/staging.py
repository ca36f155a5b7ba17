"""Tensors streamed from a file to a GPU through a few reused pinned host buffers.

Reading a whole tensor into fresh pageable memory and then copying it to the GPU costs a page
fault per 4 KiB of every buffer, a host copy the driver makes into its own pinned staging, and a
copy that waits for the whole read. Here a tensor goes in chunks: each chunk is read (``pread``,
in parallel parts) into one of a small ring of pinned buffers while the chunk before it is
copied to the device asynchronously on a side stream; a buffer is refilled once its copy has
finished. The host holds the ring and nothing else, however large the tensor.
"""

from __future__ import annotations

import os
import threading

import torch

from ..errors import CheckpointError
from .safetensors_file import TensorInfo, read_into

#: bytes per pinned buffer, and how many the ring holds (one being read, the others copying)
CHUNK_BYTES = 64 << 20
RING = 3


class DeviceStaging:
    """Reads whole tensors of files straight onto ``device`` (a GPU; any device works, a CPU one
    without pinning or a side stream, which the tests use to check the chunking)."""

    def __init__(self, device: torch.device | str, chunk_bytes: int = CHUNK_BYTES, ring: int = RING) -> None:
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        if chunk_bytes <= 0 or ring <= 0:
            raise ValueError(
                f"DeviceStaging: chunk_bytes and ring must be positive, found {chunk_bytes}, {ring}"
            )
        self.chunk = chunk_bytes
        self._bufs = [torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(ring)]
        self._done: list[torch.cuda.Event | None] = [None] * ring
        self._stream = torch.cuda.Stream(self.device) if cuda else None
        self._lock = threading.Lock()  # one tensor through the ring at a time (read-ahead threads)

    def read(self, path: os.PathLike[str] | str, data_start: int, info: TensorInfo) -> torch.Tensor:
        """Tensor ``info`` of the file at ``path`` (its data section at ``data_start``), on the
        device and complete: the copies are finished when this returns."""
        n = info.nbytes
        with self._lock:
            out = torch.empty(n, dtype=torch.uint8, device=self.device)
            fd = os.open(path, os.O_RDONLY)
            try:
                if self._stream is not None:
                    # ``out`` may reuse memory that work already queued on the default stream still
                    # reads (a tensor freed a moment ago): the copies start after that work
                    self._stream.wait_stream(torch.cuda.default_stream(self.device))
                for i, s in enumerate(range(0, n, self.chunk)):
                    k = i % len(self._bufs)
                    done = self._done[k]
                    if done is not None:
                        done.synchronize()  # the buffer's previous chunk has reached the device
                    m = min(self.chunk, n - s)
                    buf = self._bufs[k][:m]
                    try:
                        got = read_into(fd, memoryview(buf.numpy()), data_start + info.start + s)
                    except OSError as e:
                        raise CheckpointError(f"{path}: tensor {info.name!r}: cannot read: {e}") from None
                    if got != m:
                        raise CheckpointError(
                            f"{path}: tensor {info.name!r}: read {s + got} of {n} bytes (file changed "
                            "or truncated while open?)"
                        )
                    if self._stream is None:
                        out[s : s + m].copy_(buf)
                        continue
                    with torch.cuda.stream(self._stream):
                        out[s : s + m].copy_(buf, non_blocking=True)
                        ev = torch.cuda.Event()
                        ev.record(self._stream)
                    self._done[k] = ev
            finally:
                os.close(fd)
                if self._stream is not None:  # complete (or, after an error, no copy left in flight)
                    self._stream.synchronize()
        return out.view(info.dtype).reshape(info.shape)
