"""dataCid: known answers, differential checks against the reference, streaming."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2psync.dwn.datacid import CHUNK_SIZE, MAX_CHILDREN_PER_NODE, DataCidBuilder, data_cid, known
from tests.dwn.oracle_utils import needs_reference, run_oracle

MIB = 1024 * 1024
ONE_LEVEL_MAX = MAX_CHILDREN_PER_NODE * CHUNK_SIZE  # 45,613,056 bytes: the last 1-level tree

# Sizes at every boundary of the importer's layout; the last one has a two-level tree.
REFERENCE_SIZES = (
    0,
    1,
    30_000,  # inline-data limit of the reference
    30_001,
    CHUNK_SIZE - 1,
    CHUNK_SIZE,  # still a single raw block
    CHUNK_SIZE + 1,  # first dag-pb root
    2 * CHUNK_SIZE,
    2 * CHUNK_SIZE + 1,
    ONE_LEVEL_MAX,
    ONE_LEVEL_MAX + 1,  # 175 leaves: a second level over a 174-group and a 1-group
    MIB + 12_345,
    50 * MIB + 7,
)

_PATTERN = bytes(range(256))


def _pattern(size: int) -> bytes:
    return (_PATTERN * (size // 256 + 1))[:size]


def _random_bytes(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def _streamed(data: bytes, piece: int, **params: int) -> str:
    builder = DataCidBuilder(**params)
    view = memoryview(data)
    for start in range(0, len(view), piece):
        builder.update(view[start : start + piece])
    return builder.finish()


# Answers of the reference (dwn-sdk-js 0.5.2 Cid.computeDagPbCidFromBytes) for bytes
# 0,1,...,255,0,1,... of the given length; they let the suite check without Node.
KNOWN_ANSWERS = {
    0: "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku",
    CHUNK_SIZE: "bafkreibdci4uxwmvixm54ey4etx3paphmwwbv3beh4xnsndvs6tzhjav5e",
    CHUNK_SIZE + 1: "bafybeibp4affrl5svfd2wwp3l2srpu76awzmvyc37zmrtap5iqydfxffuy",
    ONE_LEVEL_MAX + 1: "bafybeifesat4tfkoyjquv3u4ptxx43lfa3xewmq4wlbn6gmosvp7ov6nfy",
}


@pytest.mark.parametrize("size", sorted(KNOWN_ANSWERS))
def test_known_answers(size: int) -> None:
    data = _pattern(size)
    assert data_cid(data) == KNOWN_ANSWERS[size]
    assert _streamed(data, 100_003) == KNOWN_ANSWERS[size]


def test_small_data_is_a_raw_cid_and_large_data_a_dag_pb_cid() -> None:
    assert data_cid(b"x" * CHUNK_SIZE).startswith("bafkrei")  # raw, sha2-256
    assert data_cid(b"x" * (CHUNK_SIZE + 1)).startswith("bafybei")  # dag-pb, sha2-256
    assert len(data_cid(b"")) == 59  # 'b' + base32 of 36 bytes, no padding


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    directory = tmp_path_factory.mktemp("datacid")
    files: dict[int, Path] = {}
    for size in REFERENCE_SIZES:
        files[size] = directory / f"{size}.bin"
        files[size].write_bytes(_random_bytes(size))
    return files


@pytest.mark.slow
@needs_reference
def test_matches_reference_at_layout_boundaries(reference_files: dict[int, Path]) -> None:
    sizes = list(reference_files)
    expected = run_oracle("datacid", {"files": [str(reference_files[s]) for s in sizes]})
    for size, want in zip(sizes, expected, strict=True):
        data = reference_files[size].read_bytes()
        assert data_cid(data) == want, f"data_cid differs for {size} bytes"
        assert _streamed(data, 65_521) == want, f"DataCidBuilder differs for {size} bytes"


@needs_reference
def test_reference_stream_api_agrees(tmp_path: Path) -> None:
    # computeDagPbCidFromStream (used for data arriving on a socket) must give the same CIDs.
    sizes = (0, CHUNK_SIZE, 3 * CHUNK_SIZE + 17)
    files = []
    for size in sizes:
        path = tmp_path / f"{size}.bin"
        path.write_bytes(_random_bytes(size))
        files.append(str(path))
    expected = run_oracle("datacid", {"files": files, "stream": True})
    assert expected == [data_cid(_random_bytes(size)) for size in sizes]


# With 16-byte chunks and 3 children a node, trees of 3 and 4 levels cost nothing: this
# checks the recursion of the balanced layout, including 1-child parents above level 1.
SMALL_CHUNK = 16
SMALL_FANOUT = 3
DEEP_SIZES = (0, 1, 16, 17, 48, 49, 64, 144, 145, 160, 432, 433, 451, 1296, 1297, 2000)


@needs_reference
def test_deep_trees_match_the_importer(tmp_path: Path) -> None:
    files = []
    for size in DEEP_SIZES:
        path = tmp_path / f"{size}.bin"
        path.write_bytes(_random_bytes(size))
        files.append(str(path))
    expected = run_oracle(
        "datacid-params",
        {"files": files, "chunkSize": SMALL_CHUNK, "maxChildren": SMALL_FANOUT},
    )
    got = [
        _streamed(_random_bytes(size), 7, chunk_size=SMALL_CHUNK, max_children=SMALL_FANOUT)
        for size in DEEP_SIZES
    ]
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=700), cuts=st.lists(st.integers(0, 700), max_size=12))
def test_any_chunking_gives_the_same_cid_small_tree(data: bytes, cuts: list[int]) -> None:
    one_shot = DataCidBuilder(chunk_size=SMALL_CHUNK, max_children=SMALL_FANOUT)
    one_shot.update(data)
    want = one_shot.finish()
    builder = DataCidBuilder(chunk_size=SMALL_CHUNK, max_children=SMALL_FANOUT)
    previous = 0
    for cut in sorted(c for c in cuts if c <= len(data)) + [len(data)]:
        builder.update(data[previous:cut])
        previous = cut
    assert builder.size == len(data)
    assert builder.finish() == want


_BIG = random.Random(1).randbytes(3 * CHUNK_SIZE + 1000)


@settings(max_examples=25, deadline=None)
@given(
    size=st.sampled_from(
        [0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 2 * CHUNK_SIZE, len(_BIG)]
    )
    | st.integers(0, len(_BIG)),
    cuts=st.lists(st.integers(0, len(_BIG)), max_size=8),
)
def test_any_chunking_gives_the_same_cid_as_data_cid(size: int, cuts: list[int]) -> None:
    data = _BIG[:size]
    builder = DataCidBuilder()
    previous = 0
    for cut in sorted(c for c in cuts if c <= size) + [size]:
        builder.update(memoryview(data)[previous:cut])
        previous = cut
    assert builder.finish() == data_cid(data)


def test_builder_accepts_bytearray_and_refuses_use_after_finish() -> None:
    builder = DataCidBuilder()
    builder.update(bytearray(b"abc"))
    builder.update(b"")
    assert builder.size == 3
    assert builder.finish() == data_cid(b"abc")
    with pytest.raises(RuntimeError):
        builder.update(b"x")
    with pytest.raises(RuntimeError):
        builder.finish()


def test_builder_refuses_a_degenerate_layout() -> None:
    with pytest.raises(ValueError):
        DataCidBuilder(chunk_size=0)
    with pytest.raises(ValueError):
        DataCidBuilder(max_children=1)


def test_known_cid_is_taken_only_for_that_object_and_only_inside_the_block() -> None:
    data = _pattern(CHUNK_SIZE + 5)
    twin = bytes(bytearray(data))  # equal contents, another object
    with known(data, "bafy-claimed"):
        assert data_cid(data) == "bafy-claimed"  # the caller's fact, by identity
        assert data_cid(twin) == data_cid(bytearray(data)) != "bafy-claimed"  # others are hashed
        with known(twin, "bafy-inner"):
            assert data_cid(twin) == "bafy-inner" and data_cid(data) != "bafy-claimed"
        assert data_cid(data) == "bafy-claimed"  # the outer fact is back
    assert data_cid(data) == data_cid(twin) != "bafy-claimed"
    with pytest.raises(TypeError):
        known(bytearray(data), "bafy-mutable")  # type: ignore[arg-type]
