"""Whether a volume file holds every byte its header promises, and is a file at all: one rule for every format.

ITK's NIfTI reader fills whatever a cut-short `.nii` or `.nii.gz` lacks with
zeros and reports nothing (nibabel raises `EOFError` on the same file), so a
scan that stopped copying at 60% would be converted, or predicted, with its
last 40% read as 0 HU. ITK's MetaImage reader raises, but names "No such file
or directory" after printing its own lines to stderr; its NRRD reader raises.
So before any reader decodes a volume file, `check_complete` compares the
bytes the header promises (voxels × values per voxel × bytes per value) with
what the file holds where the header says the data lie:

* raw data (`.nii`, NRRD `encoding: raw`, MetaImage `CompressedData = False`):
  the file's size past the header (or the detached data file's);
* gzip data (`.nii.gz`, NRRD `encoding: gzip`): gzip's own trailer records the
  length it decompresses to, which settles a whole file at once; otherwise the
  stream is decompressed in blocks and counted (nothing is kept), and a stream
  that ends early is cut short;
* MetaImage `CompressedData = True`: the header's `CompressedDataSize` against
  the bytes there, or the zlib stream counted where the header lacks it.

A file that holds less is the dead letter `cut_short`, in every format: the
same reason DICOM slices get when their pixel data are shorter than their
rows × columns × frames promise (`dicom_series`). A named pipe, socket or
device is never opened (reading one blocks or never ends): `check_regular`
refuses it as `not_a_file`.
"""

from __future__ import annotations

import bz2
import io
import os
import stat
import zlib

import nibabel
import numpy as np
from nibabel import openers

from common import dead_letters

_BLOCK = 16 * 2**20  # bytes decompressed at a time when a stream must be counted
_SPECIAL = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device"}


def special_kind(path: str) -> str | None:
    """What `path` is when it is not a regular file or a directory ("a named pipe (FIFO)", ...); None otherwise
    (also for a path that cannot be looked at: the reader then says why)."""
    try:
        mode = os.stat(path).st_mode  # follows links: a link to a FIFO is a FIFO
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _SPECIAL.get(stat.S_IFMT(mode), "not a regular file")


def not_a_file(path: str, kind: str) -> dead_letters.CaseError:
    """The dead letter of a special file: never opened, since reading one blocks or never ends."""
    return dead_letters.CaseError("discover", "not_a_file",
                                  f"{path} is {kind}, not a file; fullres reads only regular files (reading this one "
                                  "could block for ever), so it was skipped")


def check_regular(path: str) -> None:
    """Refuses a named pipe, socket or device before anything opens it.

    Raises:
        dead_letters.CaseError: `not_a_file`.
    """
    kind = special_kind(path)
    if kind is not None:
        raise not_a_file(path, kind)


def raw_nifti_header(path: str):
    """The NIfTI-1 or NIfTI-2 header as stored (nibabel's `load` would already have replaced zero pixdims by 1);
    None when the first bytes are not one."""
    with openers.ImageOpener(path) as file:
        block = file.read(540)
    for header_class in (nibabel.Nifti1Header, nibabel.Nifti2Header):
        size = header_class.sizeof_hdr
        if len(block) >= size and size in (int.from_bytes(block[:4], "little"), int.from_bytes(block[:4], "big")):
            return header_class.from_fileobj(io.BytesIO(block[:size]), check=False)
    return None


def check_complete(path: str) -> None:
    """Refuses a volume file (NIfTI, NRRD, MetaImage) that holds fewer data bytes than its header promises.

    A header this module cannot read is left to the reader, which says what is wrong with it in its own words.

    Raises:
        dead_letters.CaseError: `not_a_file` (`check_regular`), or `cut_short`, naming the file, the bytes
            it holds and those its header promises.
    """
    check_regular(path)
    lower = path.lower()
    try:
        if lower.endswith((".nii", ".nii.gz")):
            layout = _nifti(path)
        elif lower.endswith((".nrrd", ".nhdr")):
            layout = _nrrd(path)
        elif lower.endswith((".mha", ".mhd")):
            layout = _meta(path)
        else:
            return
    except (OSError, ValueError, EOFError, zlib.error):
        return  # an unreadable header: the reader names it
    if layout is None:
        return
    data_path, offset, encoding, promised, compressed_size = layout
    _compare(path, data_path, offset, encoding, promised, compressed_size)


# ---------------------------------------------------------------- where each format keeps its data
# (data file, offset of the data in it (in the decompressed stream for .nii.gz), encoding, promised bytes,
#  compressed bytes the header records or None)


def _nifti(path: str):
    header = raw_nifti_header(path)
    if header is None:
        return None
    dims = int(header["dim"][0])
    if not 1 <= dims <= 7:
        return None
    voxels = int(np.prod([max(1, int(n)) for n in header["dim"][1:dims + 1]], dtype=np.int64))
    offset = int(header["vox_offset"])
    promised = offset + voxels * int(header["bitpix"]) // 8
    return path, 0, "gzip" if path.lower().endswith(".gz") else "raw", promised, None


def _text_header(path: str, end_of_header) -> tuple[list[str], int]:
    """The header lines of a text-headed format and the byte offset where its data begin."""
    with open(path, "rb") as file:
        head = file.read(64 * 1024)
    end = end_of_header(head)
    if end is None:
        raise ValueError("no end of header")
    return head[:end].decode("latin-1").splitlines(), end


_NRRD_TYPES = {**dict.fromkeys(("signed char", "int8", "int8_t", "uchar", "unsigned char", "uint8", "uint8_t"), 1),
               **dict.fromkeys(("short", "short int", "signed short", "signed short int", "int16", "int16_t", "ushort",
                                "unsigned short", "unsigned short int", "uint16", "uint16_t"), 2),
               **dict.fromkeys(("int", "signed int", "int32", "int32_t", "uint", "unsigned int", "uint32", "uint32_t",
                                "float"), 4),
               **dict.fromkeys(("longlong", "long long", "long long int", "signed long long", "signed long long int",
                                "int64", "int64_t", "ulonglong", "unsigned long long", "unsigned long long int",
                                "uint64", "uint64_t", "double"), 8)}


def nrrd_fields(path: str) -> tuple[dict[str, str], int]:
    """A NRRD header's fields (keys lower-case) and the byte offset where its data begin.

    Raises:
        ValueError: no end of header.
    """
    def end_of_header(head: bytes):
        for separator in (b"\n\n", b"\r\n\r\n"):
            at = head.find(separator)
            if at >= 0:
                return at + len(separator)
        return len(head) if path.lower().endswith(".nhdr") else None

    lines, end = _text_header(path, end_of_header)
    fields = {}
    for line in lines[1:]:
        key, separator, value = line.partition(":")
        if separator and not line.startswith("#"):
            fields[key.strip().lower()] = value.strip()
    return fields, end


def _nrrd(path: str):
    fields, end = nrrd_fields(path)
    size = _NRRD_TYPES.get(fields.get("type", "").lower())
    encoding = {"raw": "raw", "gzip": "gzip", "gz": "gzip", "bzip2": "bzip2", "bz2": "bzip2"}.get(
        fields.get("encoding", "").lower())
    if size is None or encoding is None or not fields.get("sizes"):
        return None  # text encodings, "block" types: nothing to count in bytes
    voxels = int(np.prod([int(n) for n in fields["sizes"].split()], dtype=np.int64))
    data_file = fields.get("data file") or fields.get("datafile")
    skip = int(fields.get("byte skip", "0"))
    if int(fields.get("line skip", "0")) or skip < 0 or (data_file and (" " in data_file or data_file == "LIST")):
        return None  # data placed by lines, at the end, or in several files: left to the reader
    if data_file:
        return os.path.join(os.path.dirname(path), data_file), skip, encoding, voxels * size, None
    return path, end + skip if encoding == "raw" else end, encoding, voxels * size + (skip if encoding != "raw" else 0), None


_META_TYPES = {"MET_CHAR": 1, "MET_UCHAR": 1, "MET_SHORT": 2, "MET_USHORT": 2, "MET_INT": 4, "MET_UINT": 4,
               "MET_LONG": 4, "MET_ULONG": 4, "MET_LONG_LONG": 8, "MET_ULONG_LONG": 8, "MET_FLOAT": 4, "MET_DOUBLE": 8}


def meta_fields(path: str) -> tuple[dict[str, str], int]:
    """A MetaImage header's fields and the byte offset where its data begin (after ElementDataFile).

    Raises:
        ValueError: no ElementDataFile line.
    """
    def end_of_header(head: bytes):
        at = head.find(b"ElementDataFile")
        newline = head.find(b"\n", at) if at >= 0 else -1
        return newline + 1 if newline >= 0 else None

    lines, end = _text_header(path, end_of_header)
    fields = {}
    for line in lines:
        key, separator, value = line.partition("=")
        if separator:
            fields[key.strip()] = value.strip()
    return fields, end


def _meta(path: str):
    fields, end = meta_fields(path)
    size = _META_TYPES.get(fields.get("ElementType", ""))
    if size is None or not fields.get("DimSize") or fields.get("BinaryData", "True").lower() != "true":
        return None
    channels = int(fields.get("ElementNumberOfChannels", "1"))
    promised = int(np.prod([int(n) for n in fields["DimSize"].split()], dtype=np.int64)) * size * channels
    data_file = fields.get("ElementDataFile", "")
    compressed = fields.get("CompressedData", "False").lower() == "true"
    header_size = int(fields.get("HeaderSize", "0"))
    if data_file.upper() != "LOCAL" and (" " in data_file or "%" in data_file or data_file.upper() == "LIST"):
        return None  # one file per slice: the reader checks each
    if header_size < 0:
        return None  # data at the end of the file, however long the header: nothing to compare
    recorded = int(fields["CompressedDataSize"]) if compressed and fields.get("CompressedDataSize") else None
    if data_file.upper() == "LOCAL":
        return path, end, "zlib" if compressed else "raw", promised, recorded
    return os.path.join(os.path.dirname(path), data_file), header_size, "zlib" if compressed else "raw", promised, recorded


# ---------------------------------------------------------------- the comparison


def _compare(path: str, data_path: str, offset: int, encoding: str, promised: int, compressed_size: int | None) -> None:
    name = path if data_path == path else f"{path} (its data file {os.path.basename(data_path)})"
    if not os.path.exists(data_path):
        return  # a missing data file: the reader names it
    check_regular(data_path)
    held = os.path.getsize(data_path) - offset
    if encoding == "raw":
        if held < promised:
            raise _cut_short(name, f"holds {max(held, 0):,} of the {promised:,} data bytes its header promises")
        return
    if compressed_size is not None:
        if held < compressed_size:
            raise _cut_short(name, f"holds {max(held, 0):,} of the {compressed_size:,} compressed bytes its header "
                                   "records")
        return
    if encoding == "gzip" and _gzip_trailer_size(data_path) == promised % 2**32:
        return  # gzip's trailer: the whole stream decompresses to exactly the promised length
    length, ended = _decompressed_length(data_path, offset, encoding)
    if not ended or length < promised:
        raise _cut_short(name, f"decompresses to {length:,} of the {promised:,} bytes its header promises"
                               + ("" if ended else " before its compressed stream breaks off"))


def _cut_short(name: str, what: str) -> dead_letters.CaseError:
    return dead_letters.CaseError("read", "cut_short", f"{name} {what}: the file was cut short (a copy or download "
                                                       "that stopped), so copy it again from its source")


def _gzip_trailer_size(path: str) -> int:
    """The last 4 bytes of a gzip file: the length of its (last member's) data modulo 2^32 (RFC 1952, ISIZE)."""
    with open(path, "rb") as file:
        file.seek(0, os.SEEK_END)
        if file.tell() < 18:  # shorter than gzip's own header and trailer
            return -1
        file.seek(-4, os.SEEK_END)
        return int.from_bytes(file.read(4), "little")


def _decompressed_length(path: str, offset: int, encoding: str) -> tuple[int, bool]:
    """(bytes the stream from `offset` decompresses to, whether it ended properly), streamed in blocks.

    gzip may hold several members one after the other (bgzip writes them); each is counted."""
    if encoding == "bzip2":
        with open(path, "rb") as raw:
            raw.seek(offset)
            length = 0
            try:
                with bz2.BZ2File(raw) as stream:
                    while block := stream.read1(_BLOCK):
                        length += len(block)
            except (EOFError, OSError):
                return length, False
            return length, True
    window = zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS
    inflater, length, ended = zlib.decompressobj(window), 0, False
    with open(path, "rb") as raw:
        raw.seek(offset)
        try:
            while block := raw.read(_BLOCK):
                while block:
                    length += len(inflater.decompress(block))
                    ended, block = inflater.eof, inflater.unused_data
                    if ended and block and encoding == "gzip":  # the next gzip member
                        inflater, ended = zlib.decompressobj(window), False
                    elif ended:
                        block = b""
        except zlib.error:
            return length, False
    return length, ended
