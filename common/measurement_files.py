"""The measurement file of `python -m harness check` (common/measurements.py writes it, the harness reads it): an
uncompressed .npz, each array written once straight from its memory (`save`), with one more entry, ALIASES, listing
the names stored as another entry; read by `MeasurementFile`, every entry checked when the file is opened and each
array a read-only view of the file mapped in memory. The file is untrusted input to its reader."""

from __future__ import annotations

import math
import mmap
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping

import numpy as np

# The entry that lists the names stored as another entry: an (n, 2) array of strings, (name, stored entry).
ALIASES = "aliases"
# A zip entry's local file header: 30 bytes, then its name and extra field (PKWARE's APPNOTE, 4.3.7).
_LOCAL_HEADER = 30


def save(path: str, arrays: dict) -> None:
    """`arrays` as an uncompressed .npz at `path`, each array written once, straight from its memory: np.savez
    copied every array through fresh 16 MB buffers, most of a ResNet-50 check's time. An array stored under
    several names (the same object) is written under its first and listed in ALIASES under the others."""
    stored, aliases = {}, []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as f:
        for name, value in arrays.items():
            if id(value) in stored:
                aliases.append((name, stored[id(value)]))
                continue
            stored[id(value)] = name
            _write(f, name, np.asarray(value))
        if aliases:
            _write(f, ALIASES, np.array(aliases))


def _entry_name(filename: str) -> str:
    """An entry's name, as np.load lists it: its file name less .npy."""
    return filename[:-4] if filename.endswith(".npy") else filename


def _write(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    """One .npy entry, as np.savez writes it, with its data handed to the file in one piece."""
    array = array if array.flags.c_contiguous else np.copy(array, order="C")  # (0-d stays 0-d)
    with archive.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
        f.write(np.ravel(array).view(np.uint8))


class MeasurementFile(Mapping):
    """A measurement file, every entry checked when it is opened (its CRC-32, its .npy header against its size)
    and read when asked for (an alias as the entry it names): an uncompressed entry is a read-only view of the
    file mapped in memory, so a reader never holds a whole file (a ResNet-50 check's are gigabytes) and never
    copies it (np.load copied every array out of the file each time it was asked for, gigabytes of a ResNet-50
    check's comparisons). Untrusted input: a file that is no zip archive, a damaged entry, or an ALIASES that is
    malformed or names an entry the file lacks raises OSError, ValueError or BadZipFile here; an entry that is
    not there, KeyError when asked for. Close it (or use it with `with`) when done."""

    def __init__(self, path):
        self._fd = open(path, "rb")
        try:
            self._zip = zipfile.ZipFile(self._fd)
            infos = {_entry_name(i.filename): i for i in self._zip.infolist()}
            self._map = mmap.mmap(self._fd.fileno(), 0, access=mmap.ACCESS_READ)
            self._entries = {name: self._locate(info) for name, info in infos.items()}
            self._stored = set(self._entries) - {ALIASES}
            self._aliases = self._read_aliases()
        except BaseException:
            self._fd.close()
            raise
        self._names = [n for n in self._entries if n in self._stored] + list(self._aliases)

    def _read_aliases(self) -> dict[str, str]:
        if ALIASES not in self._entries:
            return {}
        table = self._array(ALIASES)
        if table.dtype.kind != "U" or table.ndim != 2 or table.shape[1] != 2:
            raise ValueError(f"{ALIASES} is not a list of (name, stored entry) pairs")
        aliases = {}
        for name, target in table.tolist():
            if target not in self._stored:
                raise ValueError(
                    f"{ALIASES}: {name!r} is stored as {target!r}, which the file lacks"
                )
            if name in self._stored or name in aliases:
                raise ValueError(f"{ALIASES}: {name!r} is stored twice")
            aliases[name] = target
        return aliases

    def _array(self, entry: str) -> np.ndarray:
        where = self._entries[entry]
        if isinstance(where, zipfile.ZipInfo):  # (not save()'s: read as np.load reads it)
            with self._zip.open(where) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        dtype, shape, fortran, offset = where
        array = np.frombuffer(self._map, dtype, math.prod(shape), offset)
        return array.reshape(shape, order="F" if fortran else "C")

    def _locate(self, info: zipfile.ZipInfo) -> tuple | zipfile.ZipInfo:
        """(dtype, shape, Fortran order, offset in the file) of an uncompressed .npy entry, checked: its local
        header, its CRC-32, its .npy header, and its data's size against the header's shape. Another entry
        (compressed, or a .npy header of a version numpy alone reads) is read whole now, which checks it, and
        again when asked for."""
        if info.compress_type != zipfile.ZIP_STORED:
            return self._checked_whole(info)
        local = self._map[info.header_offset : info.header_offset + _LOCAL_HEADER]
        if len(local) != _LOCAL_HEADER or local[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"{info.filename}: no local file header")
        name, extra = struct.unpack("<HH", local[26:30])
        start = info.header_offset + _LOCAL_HEADER + name + extra
        data = memoryview(self._map)[start : start + info.compress_size]
        if len(data) != info.compress_size:
            raise zipfile.BadZipFile(f"{info.filename}: truncated")
        if zlib.crc32(data) != info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
        with self._zip.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                return self._checked_whole(info)
            read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
        if dtype.hasobject:
            raise ValueError(f"{info.filename}: an array of Python objects (pickles are not read)")
        if offset + math.prod(shape) * dtype.itemsize != info.compress_size:
            raise ValueError(f"{info.filename}: its data is not the size of its shape {shape}")
        return dtype, shape, fortran, start + offset

    def _checked_whole(self, info: zipfile.ZipInfo) -> zipfile.ZipInfo:
        with self._zip.open(info) as f:
            np.lib.format.read_array(f, allow_pickle=False)
        return info

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self:
            raise KeyError(f"{name} is not in the measurements")
        return self._array(self._aliases.get(name, name))

    def __contains__(self, name) -> bool:
        return name in self._stored or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def close(self) -> None:
        """The file closed; arrays read from it keep its mapping until they are gone."""
        self._zip.close()
        self._fd.close()
        self._map = None

    def __enter__(self) -> MeasurementFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
