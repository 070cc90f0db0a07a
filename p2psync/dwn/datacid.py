"""The ``dataCid`` of record data, exactly as the reference DWN computes it.

dwn-sdk-js 0.5.2 (``Cid.computeDagPbCidFromBytes`` / ``computeDagPbCidFromStream``) runs
``ipfs-unixfs-importer`` 15.1.5 with ``{cidVersion: 1}`` and its defaults:

* fixed-size chunks of 262,144 bytes; an empty input is one empty chunk, and data that is an
  exact multiple of the chunk size gets no trailing empty chunk;
* raw leaves: each chunk is a block of codec ``raw`` (0x55), CIDv1, sha2-256;
* a single chunk is its own root, so data up to 262,144 bytes has ``dataCid`` =
  ``CIDv1(raw, sha256(data))``;
* otherwise a *balanced* tree: the chunks are grouped 174 at a time, each group becomes one
  UnixFS ``file`` node (dag-pb, 0x70), those nodes are grouped 174 at a time again, and so
  on until one node is left. A last group of one still gets its own parent node.

A file node is a dag-pb ``PBNode`` written links first: for every child a ``PBLink``
``{Hash: <child CID bytes>, Name: "", Tsize: <child's cumulative size>}`` (the empty name
is written, as ``12 00``), then ``Data``: a UnixFS message ``{Type: File, filesize: <bytes
under the node>, blocksizes: [<bytes under each child>]}``; no ``Data`` bytes, no mode
(the default 0644 is left out), no mtime. ``Tsize`` of a raw leaf is its length; of a file
node, its encoded length plus the ``Tsize`` of all its links.

Everything here is built by hand: hashing dominates, so large data goes at sha256 speed.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Final

from p2psync.dwn import memo
from p2psync.dwn.encoding import base32_multibase

#: Chunk size of the importer's default fixed-size chunker (ipfs-unixfs-importer 15.1.5).
CHUNK_SIZE: Final = 262_144
#: Children per node of the importer's default balanced layout.
MAX_CHILDREN_PER_NODE: Final = 174

# CIDv1 prefixes: version 1, codec, multihash sha2-256 (0x12) of 32 bytes (0x20).
_RAW_CID_PREFIX: Final = b"\x01\x55\x12\x20"
_DAG_PB_CID_PREFIX: Final = b"\x01\x70\x12\x20"

# Protobuf tags (field number << 3 | wire type).
_PB_NODE_DATA: Final = b"\x0a"  # PBNode.Data = 1, bytes
_PB_NODE_LINK: Final = b"\x12"  # PBNode.Links = 2, bytes (repeated)
_PB_LINK_HASH: Final = b"\x0a"  # PBLink.Hash = 1, bytes
_PB_LINK_EMPTY_NAME: Final = b"\x12\x00"  # PBLink.Name = 2, the empty string
_PB_LINK_TSIZE: Final = 0x18  # PBLink.Tsize = 3, varint
_UNIXFS_TYPE_FILE: Final = b"\x08\x02"  # Data.Type = 1, varint File (2)
_UNIXFS_FILESIZE: Final = 0x18  # Data.filesize = 3, varint
_UNIXFS_BLOCKSIZE: Final = 0x20  # Data.blocksizes = 4, varint, repeated, not packed


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _cid_string(cid: bytes) -> str:
    """Multibase base32 (``b`` + lowercase RFC 4648 alphabet, no padding)."""
    return base32_multibase(cid)


@dataclass(frozen=True, slots=True)
class _Child:
    """A node of the tree as its parent sees it."""

    cid: bytes  # binary CIDv1
    tsize: int  # cumulative encoded size (PBLink.Tsize)
    file_size: int  # bytes of record data below it (UnixFS blocksize)


def _file_node(children: list[_Child]) -> _Child:
    """Encode the UnixFS file node over ``children`` and describe it for its parent."""
    parts: list[bytes] = []
    for child in children:
        link = (
            _PB_LINK_HASH
            + _varint(len(child.cid))
            + child.cid
            + _PB_LINK_EMPTY_NAME
            + bytes((_PB_LINK_TSIZE,))
            + _varint(child.tsize)
        )
        parts += (_PB_NODE_LINK, _varint(len(link)), link)
    file_size = sum(child.file_size for child in children)
    unixfs = [_UNIXFS_TYPE_FILE, bytes((_UNIXFS_FILESIZE,)), _varint(file_size)]
    for child in children:
        unixfs += (bytes((_UNIXFS_BLOCKSIZE,)), _varint(child.file_size))
    data = b"".join(unixfs)
    parts += (_PB_NODE_DATA, _varint(len(data)), data)
    block = b"".join(parts)
    return _Child(
        cid=_DAG_PB_CID_PREFIX + hashlib.sha256(block).digest(),
        tsize=len(block) + sum(child.tsize for child in children),
        file_size=file_size,
    )


class _TreeBuilder:
    """Folds leaves into the balanced tree, keeping at most 174 pending nodes a level."""

    def __init__(self, max_children: int = MAX_CHILDREN_PER_NODE) -> None:
        self._max_children = max_children
        # levels[i] holds the nodes of height i not yet grouped under a parent; counts[i] is
        # how many nodes of height i there are in all (a level of one node is the root).
        self._levels: list[list[_Child]] = [[]]
        self._counts: list[int] = [0]

    def add_leaf(self, digest: bytes, size: int) -> None:
        self._add(0, _Child(_RAW_CID_PREFIX + digest, size, size))

    def _add(self, height: int, node: _Child) -> None:
        if height == len(self._levels):
            self._levels.append([])
            self._counts.append(0)
        level = self._levels[height]
        level.append(node)
        self._counts[height] += 1
        # A full group is final whatever follows: the layout batches 174 at a time.
        if len(level) == self._max_children:
            self._levels[height] = []
            self._add(height + 1, _file_node(level))

    def root(self) -> bytes:
        """The binary CID of the root; the builder must not be used afterwards."""
        height = 0
        while True:
            if self._counts[height] == 1:
                # Only one node at this height: it is the root (for height 0, the single
                # leaf is its own root, as the importer's reduceSingleLeafToSelf does).
                return self._levels[height][0].cid
            if self._levels[height]:
                pending = self._levels[height]
                self._levels[height] = []
                self._add(height + 1, _file_node(pending))
            height += 1


class DataCidBuilder:
    """Computes a ``dataCid`` incrementally, in bounded memory (one sha256 state and at
    most 174 pending CIDs per tree level), for data fed in chunks of any size.
    """

    def __init__(
        self, chunk_size: int = CHUNK_SIZE, max_children: int = MAX_CHILDREN_PER_NODE
    ) -> None:
        """The defaults are the reference's; other values exist to test deep trees cheaply
        (the importer takes the same two options).
        """
        if chunk_size < 1 or max_children < 2:
            raise ValueError("chunk_size must be >= 1 and max_children >= 2")
        self._chunk_size = chunk_size
        self._tree = _TreeBuilder(max_children)
        self._leaf = hashlib.sha256()
        self._leaf_size = 0  # bytes in the current (unfinished) leaf
        self._finished = False
        #: Bytes seen so far.
        self.size = 0

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        """Feed the next piece of the data."""
        if self._finished:
            raise RuntimeError("DataCidBuilder.update() after finish()")
        view = memoryview(chunk).cast("B")
        self.size += len(view)
        pos = 0
        end = len(view)
        while pos < end:
            take = min(self._chunk_size - self._leaf_size, end - pos)
            self._leaf.update(view[pos : pos + take])
            self._leaf_size += take
            pos += take
            # A full chunk is emitted as soon as it is complete; only the final remainder
            # (or the empty chunk of empty data) waits for finish().
            if self._leaf_size == self._chunk_size:
                self._tree.add_leaf(self._leaf.digest(), self._chunk_size)
                self._leaf = hashlib.sha256()
                self._leaf_size = 0

    def finish(self) -> str:
        """Return the ``dataCid`` of all the data fed (base32 ``bafk…`` or ``bafy…``)."""
        if self._finished:
            raise RuntimeError("DataCidBuilder.finish() called twice")
        self._finished = True
        if self._leaf_size > 0 or self.size == 0:
            self._tree.add_leaf(self._leaf.digest(), self._leaf_size)
        return _cid_string(self._tree.root())


_local = threading.local()


class known:  # noqa: N801 - used as a statement: ``with datacid.known(data, cid):``
    """``with known(data, cid):`` — :func:`data_cid` of this very ``bytes`` object is ``cid``
    until the block ends, on this thread.

    For a caller that hashed the data as its pieces arrived (a :class:`DataCidBuilder` fed
    exactly the pieces ``data`` was joined from): the sink's check and the engine's then take
    that CID instead of hashing 10 MiB twice more (issue #17). Kept by identity and only while
    the block runs: a ``bytes`` object cannot change, and the block holds it alive, so its
    identity cannot pass to other bytes meanwhile. Any other object, equal or not, is hashed.
    """

    __slots__ = ("_fact", "_previous")

    def __init__(self, data: bytes, cid: str) -> None:
        if type(data) is not bytes:
            raise TypeError("only an immutable bytes object can be known by identity")
        self._fact = (data, cid)
        self._previous: tuple[bytes, str] | None = None

    def __enter__(self) -> None:
        self._previous = getattr(_local, "known", None)
        _local.known = self._fact

    def __exit__(self, *exc: object) -> None:
        _local.known = self._previous
        self._previous = None


def data_cid(data: bytes | bytearray | memoryview) -> str:
    """Return the reference DWN's ``dataCid`` of ``data``.

    Within an engine call (:mod:`p2psync.dwn.memo`) the CID of the last ``bytes`` object
    hashed is kept: the replicated apply checks the data before the handler checks it again,
    and a ``bytes`` object cannot change. Within :class:`known`, its object's CID is taken.
    """
    fact: tuple[bytes, str] | None = getattr(_local, "known", None)
    if fact is not None and fact[0] is data:
        return fact[1]
    held = memo.current()
    if held is None or type(data) is not bytes:
        return _data_cid(data)
    if held.data is not data:
        held.data_cid = _data_cid(data)
        held.data = data
    assert held.data_cid is not None
    return held.data_cid


def _data_cid(data: bytes | bytearray | memoryview) -> str:
    view = memoryview(data).cast("B")
    size = len(view)
    if size <= CHUNK_SIZE:
        return _cid_string(_RAW_CID_PREFIX + hashlib.sha256(view).digest())
    tree = _TreeBuilder()
    sha256 = hashlib.sha256
    for start in range(0, size, CHUNK_SIZE):
        leaf = view[start : start + CHUNK_SIZE]
        tree.add_leaf(sha256(leaf).digest(), len(leaf))
    return _cid_string(tree.root())
