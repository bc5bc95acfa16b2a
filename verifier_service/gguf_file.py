"""A GGUF file's metadata and tensors, read from a memory map without copying the weights.

gguf-py's ``GGUFReader`` builds a numpy array for every part of every metadata field: for a 262 k-token
vocabulary that is 39 s and 700 MB before a weight is touched. This reader parses the header with
``struct`` over the map, keeps string arrays (the tokenizer's tokens) as (offset, count) until asked
for them, and hands out each tensor as a read-only view of the map: [rows, bytes a row] for block
types, [rows, columns] for F32/F16/BF16. Pages are read by the OS when a kernel touches them, and are
shared with the page cache rather than counted twice.

Layout (GGUF v2/v3): magic, version, tensor count, metadata count; metadata (key, type, value);
tensor infos (name, dims innermost first, type, offset from the data start); data aligned to
``general.alignment`` (32 by default).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9


def block_geometry(kind: str) -> tuple[int, int]:
    """(weights a block, bytes a block) of a ggml type name ("Q4_K": (256, 144); "F32": (1, 4))."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[kind]]


def type_name(code: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(code).name
    except ValueError:
        return f"type{code}"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str                 # ggml type name: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, ...
    shape: tuple[int, ...]    # as torch sees it: outermost first ([out, in] for a weight)
    offset: int               # bytes from the start of the file
    nbytes: int


class StringArray:
    """A metadata array of strings left in the map: ``len``, indexing and ``list()`` decode on demand."""

    def __init__(self, buf, offset: int, count: int):
        self._buf, self._offset, self._count = buf, offset, count
        self._starts: list[int] | None = None

    def __len__(self) -> int:
        return self._count

    def _index(self) -> list[int]:
        if self._starts is None:
            starts, at, buf = [], self._offset, self._buf
            for _ in range(self._count):
                starts.append(at)
                at += 8 + struct.unpack_from("<Q", buf, at)[0]
            self._starts = starts
        return self._starts

    def __getitem__(self, i: int) -> str:
        at = self._index()[i]
        n = struct.unpack_from("<Q", self._buf, at)[0]
        return bytes(self._buf[at + 8:at + 8 + n]).decode("utf-8", errors="replace")

    def __iter__(self):
        return (self[i] for i in range(self._count))


class GgufFile:
    """``GgufFile(path)``: ``.metadata`` {key: value} (numbers, strings, numpy arrays, ``StringArray``),
    ``.tensors`` {name: TensorInfo}, ``.raw(name)`` a read-only view of a tensor's bytes/values."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._map
        if buf[:4] != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (magic {bytes(buf[:4])!r})")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        self.version = version
        at = 24
        self.metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key, at = self._string(at)
            vtype = struct.unpack_from("<I", buf, at)[0]
            self.metadata[key], at = self._value(vtype, at + 4)
        infos = []
        for _ in range(n_tensors):
            name, at = self._string(at)
            n_dims = struct.unpack_from("<I", buf, at)[0]
            dims = struct.unpack_from(f"<{n_dims}Q", buf, at + 4)
            code, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * n_dims)
            at += 4 + 8 * n_dims + 12
            infos.append((name, tuple(int(d) for d in dims), type_name(code), int(offset)))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = (at + alignment - 1) // alignment * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, dims, kind, offset in infos:
            per_block, block_bytes = block_geometry(kind)
            count = int(np.prod(dims)) if dims else 1
            nbytes = count // per_block * block_bytes
            start = data_start + offset
            if start + nbytes > self.size:
                raise ValueError(f"{self.path}: tensor {name} runs past the end of the file (truncated?)")
            self.tensors[name] = TensorInfo(name, kind, tuple(reversed(dims)), start, nbytes)
        self._array = np.frombuffer(buf, dtype=np.uint8)

    # ---- header parsing ----------------------------------------------------------------------------
    def _string(self, at: int) -> tuple[str, int]:
        n = struct.unpack_from("<Q", self._map, at)[0]
        return bytes(self._map[at + 8:at + 8 + n]).decode("utf-8", errors="replace"), at + 8 + n

    def _value(self, vtype: int, at: int):
        buf = self._map
        if vtype in _SCALARS:
            fmt = _SCALARS[vtype]
            return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
        if vtype == STRING:
            return self._string(at)
        if vtype == ARRAY:
            etype, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if etype in _NUMPY:
                dtype = np.dtype(_NUMPY[etype]).newbyteorder("<")
                values = np.frombuffer(buf, dtype=dtype, count=count, offset=at)
                return values, at + count * dtype.itemsize
            if etype == STRING:
                strings = StringArray(buf, at, count)
                for _ in range(count):
                    at += 8 + struct.unpack_from("<Q", buf, at)[0]
                return strings, at
            items = []
            for _ in range(count):
                value, at = self._value(etype, at)
                items.append(value)
            return items, at
        raise ValueError(f"{self.path}: unknown GGUF value type {vtype}")

    # ---- access ------------------------------------------------------------------------------------
    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def matrix_bytes(self, skip=()) -> dict[str, int]:
        """{block type: bytes} of the file's matrices (2-D tensors), those named in ``skip`` left out."""
        out: dict[str, int] = {}
        for name, t in self.tensors.items():
            if len(t.shape) == 2 and name not in skip:
                out[t.kind] = out.get(t.kind, 0) + t.nbytes
        return out

    def raw(self, name: str) -> np.ndarray:
        """The tensor's data as a read-only view of the map: [rows, bytes a row] (uint8) for block types,
        [rows, columns] (float32 / float16 / bfloat16 as uint16) for float types; 1-D tensors stay 1-D."""
        info = self.tensors[name]
        data = self._array[info.offset:info.offset + info.nbytes]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        if info.kind == "F32":
            data = data.view(np.float32)
        elif info.kind == "F16":
            data = data.view(np.float16)
        elif info.kind == "BF16":
            data = data.view(np.uint16)
        return data.reshape(info.shape[0]) if len(info.shape) == 1 else data.reshape(rows, -1)

    def vector(self, name: str) -> np.ndarray:
        """A small F32/F16 tensor (a norm weight, rope factors) as a float32 copy."""
        info = self.tensors[name]
        if info.kind not in ("F32", "F16"):
            raise ValueError(f"{name} is {info.kind}, expected F32/F16")
        return np.array(self.raw(name), dtype=np.float32).reshape(info.shape)

    def release(self, name: str) -> None:
        """Drops the tensor's pages from this process's resident set (they stay in the page cache): for a
        tensor copied into another layout at load, so the copy is not counted twice."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        begin = (info.offset + page - 1) // page * page
        end = (info.offset + info.nbytes) // page * page
        if end > begin and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, begin, end - begin)

    def close(self) -> None:
        self._array = None
        try:
            self._map.close()
        except BufferError:      # views still alive: the map goes when they do
            pass
