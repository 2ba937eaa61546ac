"""GGUF v2/v3 files: our own header parser over a read-only memory map, then zero-copy tensor views.

gguf-py's GGUFReader builds a numpy view per string and takes ~14 s on a 262k-token vocabulary; this parser
decodes string arrays in one tight struct loop. Everything is validated before any tensor byte is touched,
and every failure is a ModelLoadError naming the file (and the tensor) -- never IndexError or struct.error.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from cpu_kernels.quant.qtypes import QUANT_SIZES
from engine.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALAR = {  # value type -> (struct, python cast)
    GGUFValueType.UINT8: struct.Struct("<B"), GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"), GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"), GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.UINT64: struct.Struct("<Q"), GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT32: struct.Struct("<f"), GGUFValueType.FLOAT64: struct.Struct("<d"),
    GGUFValueType.BOOL: struct.Struct("<B"),
}
_NP_DTYPE = {
    GGUFValueType.UINT8: np.dtype("u1"), GGUFValueType.INT8: np.dtype("i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.FLOAT64: np.dtype("<f8"),
    GGUFValueType.BOOL: np.dtype("u1"),
}
# Unquantized tensor types whose raw() view is typed; BF16 stays as its bits (uint16).
TYPED_TENSOR_DTYPES = {
    GGMLQuantizationType.F32: np.dtype("<f4"), GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.BF16: np.dtype("<u2"), GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("i1"), GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"), GGMLQuantizationType.I64: np.dtype("<i8"),
}
# Smallest encoding of one item, used to reject counts the remaining bytes cannot hold before allocating.
_MIN_ITEM_BYTES = {t: s.size for t, s in _SCALAR.items()}
_MIN_ITEM_BYTES[GGUFValueType.STRING] = 8
_MIN_ITEM_BYTES[GGUFValueType.ARRAY] = 12
_MIN_KV_BYTES = 8 + 4 + 1
_MAX_ARRAY_NESTING = 8  # no real file nests arrays; a corrupt one must not exhaust the Python stack
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: shape in numpy order (GGUF's ne[0] is the last dim); offset is absolute in the file.

    For tensors an HF loader derives (permuted, +1, stacked) offset is -1: the bytes live nowhere on disk.
    """
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def row_bytes(ggml_type: GGMLQuantizationType, row_len: int) -> int:
    """Bytes of one row of `row_len` elements (row_len must be a multiple of the block size)."""
    block_size, type_size = QUANT_SIZES[ggml_type]
    return row_len // block_size * type_size


def tensor_nbytes(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * row_bytes(ggml_type, shape[-1])


def raw_view(buf, info: TensorInfo) -> np.ndarray:
    """Zero-copy view of `info`'s bytes in `buf`: typed with `shape` for F32/F16/BF16(uint16)/ints,
    uint8 (*shape[:-1], bytes_per_row) for quantized types."""
    dtype = TYPED_TENSOR_DTYPES.get(info.ggml_type)
    if dtype is not None:
        return np.frombuffer(buf, dtype=dtype, count=info.nbytes // dtype.itemsize,
                             offset=info.offset).reshape(info.shape)
    arr = np.frombuffer(buf, dtype=np.uint8, count=info.nbytes, offset=info.offset)
    return arr.reshape(*info.shape[:-1], row_bytes(info.ggml_type, info.shape[-1]))


class GGUFFile:
    """A parsed, validated GGUF file over a read-only memory map.

    Attributes:
        path: the file. version: 2 or 3. arch: metadata["general.architecture"] ("" if absent).
        metadata: key -> str | int | float | bool | list[str] | np.ndarray | list (nested arrays).
            Strings that are not valid UTF-8 keep their bytes as lone surrogates
            (s.encode("utf-8", "surrogateescape") gives them back).
        metadata_types: key -> GGUFValueType of the stored value.
        tensors: name -> TensorInfo, in file order. alignment, data_offset: where tensor data starts.
    """

    def __init__(self, path: str, mm: mmap.mmap, version: int, metadata: dict[str, Any],
                 metadata_types: dict[str, GGUFValueType], tensors: dict[str, TensorInfo],
                 alignment: int, data_offset: int):
        self.path = path
        self.version = version
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset
        self._mm = mm
        arch = metadata.get("general.architecture", "")
        self.arch = arch if isinstance(arch, str) else ""

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, v{self.version}, arch={self.arch!r}, {len(self.tensors)} tensors)"

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelLoadError(f"{self.path}: tensor '{name}': not in the file") from None

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy read-only view of tensor `name` (see raw_view for its dtype and shape)."""
        if self._mm is None:
            raise ModelLoadError(f"{self.path}: tensor '{name}': file is closed")
        return raw_view(self._mm, self.info(name))

    def release(self, name: str, lo: int = 0, hi: int | None = None) -> None:
        """Tell the kernel this process is done with tensor `name`'s mapped pages (after repacking it), or with
        its bytes [lo, hi): they leave the process's RSS (the page cache keeps them; a later raw() faults them
        back in). Whole pages inside the range only, so a neighbour's pages stay."""
        if self._mm is None or not hasattr(self._mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        info = self.info(name)
        hi = info.nbytes if hi is None else min(hi, info.nbytes)
        page = mmap.PAGESIZE
        start = -(-(info.offset + lo) // page) * page
        end = (info.offset + hi) // page * page
        if end > start:
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            except OSError:  # advice only
                pass

    def required(self, names: Iterable[str]) -> None:
        """Raise ModelLoadError naming the missing tensors if any of `names` is absent."""
        missing = [n for n in names if n not in self.tensors]
        if missing:
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise ModelLoadError(f"{self.path}: missing required tensor(s) "
                                 f"{', '.join(repr(n) for n in missing[:5])}{more}")

    def close(self) -> None:
        """Drop the map; views handed out by raw() keep it alive until they are gone."""
        self._mm = None


class _Reader:
    """Bounds-checked little-endian cursor over the map; every overrun is a ModelLoadError."""

    def __init__(self, path: str, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, reason: str):
        raise ModelLoadError(f"{self.path}: {reason}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            self.fail(f"truncated header: {what} at byte {self.pos} needs {n} bytes, "
                      f"file has {self.size}")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str, strict: bool = False) -> str:
        n = self.u64(what + " length")
        self.need(n, what)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            if strict:
                self.fail(f"{what} is not valid UTF-8: {b[:64]!r}")
            return b.decode("utf-8", "surrogateescape")

    def value_type(self, what: str) -> GGUFValueType:
        t = self.u32(what + " type")
        try:
            return GGUFValueType(t)
        except ValueError:
            self.fail(f"{what}: unknown value type {t}")

    def value(self, vtype: GGUFValueType, what: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            return self.array(what, 0)
        st = _SCALAR[vtype]
        self.need(st.size, what)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return bool(v) if vtype == GGUFValueType.BOOL else v

    def array(self, what: str, depth: int) -> Any:
        if depth >= _MAX_ARRAY_NESTING:
            self.fail(f"{what}: arrays nested more than {_MAX_ARRAY_NESTING} deep")
        itype = self.value_type(what + " item")
        count = self.u64(what + " count")
        # A corrupt count must fail here, not after allocating: each item takes at least this many bytes.
        if count * _MIN_ITEM_BYTES[itype] > self.size - self.pos:
            self.fail(f"{what}: array of {count} {itype.name} items does not fit in the "
                      f"{self.size - self.pos} bytes left")
        if itype == GGUFValueType.STRING:
            return self._string_array(count, what)
        if itype == GGUFValueType.ARRAY:
            return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]
        dtype = _NP_DTYPE[itype]
        n = count * dtype.itemsize
        arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += n
        return arr.astype(bool) if itype == GGUFValueType.BOOL else arr

    def _string_array(self, count: int, what: str) -> list[str]:
        # The hot loop: ~262k tokens in gemma3. Locals only, one unpack and one slice per string.
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.fail(f"truncated header: {what} item {len(out)} length at byte {pos}")
            n = unpack(buf, pos)[0]
            pos += 8
            end = pos + n
            if end > size:
                self.pos = pos
                self.fail(f"truncated header: {what} item {len(out)} ({n} bytes) at byte {pos} "
                          f"runs past the end of the file ({size} bytes)")
            b = buf[pos:end]
            try:
                append(b.decode("utf-8"))
            except UnicodeDecodeError:
                append(b.decode("utf-8", "surrogateescape"))
            pos = end
        self.pos = pos
        return out


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and validate a GGUF v2/v3 file, memory-mapped read-only.

    Args:
        path: the .gguf file.
    Returns:
        GGUFFile whose tensors are all inside the file, aligned, of known types, non-overlapping.
    Raises:
        ModelLoadError: anything wrong with the file, naming the file, the tensor and the reason.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise ModelLoadError(f"{path}: not a GGUF file: only {size} bytes "
                                     "(the header alone takes 24)")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e}") from e
    return _parse(path, mm, size)


def _parse(path: str, mm: mmap.mmap, size: int) -> GGUFFile:
    r = _Reader(path, mm, size)
    magic = mm[0:4]
    if magic != GGUF_MAGIC:
        r.fail(f"not a GGUF file: magic {magic!r}, expected {GGUF_MAGIC!r}")
    r.pos = 4
    version = r.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            r.fail(f"big-endian GGUF (version {version >> 24}) is not supported")
        r.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    if n_kv * _MIN_KV_BYTES > size - r.pos:
        r.fail(f"corrupt header: metadata count {n_kv} cannot fit in a {size}-byte file")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > size - r.pos:
        r.fail(f"corrupt header: tensor count {n_tensors} cannot fit in a {size}-byte file")

    metadata: dict[str, Any] = {}
    types: dict[str, GGUFValueType] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}", strict=True)
        if key in metadata:
            r.fail(f"duplicate metadata key '{key}'")
        vtype = r.value_type(f"metadata '{key}'")
        metadata[key] = r.value(vtype, f"metadata '{key}'")
        types[key] = vtype

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        alignment = metadata["general.alignment"]
        if (types["general.alignment"] != GGUFValueType.UINT32 or alignment <= 0
                or alignment & (alignment - 1)):
            r.fail(f"general.alignment must be a power-of-two uint32, got {alignment!r}")

    raw_infos = []
    for i in range(n_tensors):
        name = r.string(f"tensor #{i} name", strict=True)
        n_dims = r.u32(f"tensor '{name}' n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            r.fail(f"tensor '{name}': n_dims {n_dims} is not in 1..{MAX_DIMS}")
        ne = [r.u64(f"tensor '{name}' dim {d}") for d in range(n_dims)]
        type_id = r.u32(f"tensor '{name}' type")
        offset = r.u64(f"tensor '{name}' offset")
        raw_infos.append((name, ne, type_id, offset))
    data_offset = -(-r.pos // alignment) * alignment
    if data_offset > size:
        r.fail(f"truncated file: tensor data would start at byte {data_offset}, file has {size}")
    data_size = size - data_offset

    tensors: dict[str, TensorInfo] = {}
    for name, ne, type_id, offset in raw_infos:
        where = f"{path}: tensor '{name}'"
        if name in tensors:
            raise ModelLoadError(f"{where}: duplicate tensor name")
        try:
            gtype = GGMLQuantizationType(type_id)
            block_size, _ = GGML_QUANT_SIZES[gtype]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{where}: unknown tensor type id {type_id}") from None
        if any(d <= 0 for d in ne):
            raise ModelLoadError(f"{where}: dims {ne} must all be > 0")
        if ne[0] % block_size:
            raise ModelLoadError(f"{where}: row length {ne[0]} is not a multiple of "
                                 f"{gtype.name}'s block size {block_size}")
        if offset % alignment:
            raise ModelLoadError(f"{where}: data offset {offset} is not a multiple of the "
                                 f"alignment {alignment}")
        shape = tuple(reversed(ne))
        nbytes = tensor_nbytes(gtype, shape)
        if offset + nbytes > data_size:
            raise ModelLoadError(f"{where}: data [{offset}, {offset + nbytes}) lies past the end of "
                                 f"the tensor data ({data_size} bytes; file truncated or corrupt)")
        tensors[name] = TensorInfo(name, gtype, shape, data_offset + offset, nbytes)

    by_offset = sorted(tensors.values(), key=lambda t: t.offset)
    for a, b in zip(by_offset, by_offset[1:]):
        if b.offset < a.offset + a.nbytes:
            raise ModelLoadError(f"{path}: tensor '{b.name}': data overlaps tensor '{a.name}'")
    return GGUFFile(path, mm, version, metadata, types, tensors, alignment, data_offset)
