"""wicore.export.gguf_file: real GGUFs read as gguf-py reads them, every value type, and bad files
refused with ModelSourceError (never an IndexError or struct.error)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

from wicore.errors import ModelSourceError
from wicore.export.gguf_file import read_gguf

CORRUPT = "is not a readable GGUF file \\(truncated or corrupt\\?\\)"


def typed(value: Any) -> Any:
    """A value with its type, so that 1, 1.0 and True differ."""
    return [typed(v) for v in value] if isinstance(value, list) else (type(value).__name__, value)


@pytest.fixture(params=["gemma3-270m", "smollm2-135m-instruct"])
def real_gguf(request: pytest.FixtureRequest) -> Path:
    """The packaged Gemma 3 270M and the pulled SmolLM2: missing, the test fails as the rest of the suite does."""
    if request.param == "gemma3-270m":
        from wicore.export.sources import packaged_gguf

        return packaged_gguf("gemma3-270m")
    return request.getfixturevalue("smollm2_gguf")


@pytest.mark.slow
def test_a_real_gguf_reads_as_gguf_py_reads_it(real_gguf: Path):
    """Every key's value (type included) and every tensor's name, type, shape and bytes, with
    gguf-py's GGUFReader as the reference (~15 s of it for the 270M's vocabulary)."""
    ours = read_gguf(real_gguf)
    reader = gguf.GGUFReader(str(real_gguf))
    fields = {key: field.contents() for key, field in reader.fields.items()}
    assert (ours.version, len(ours.tensors), len(ours.metadata)) == (
        fields.pop("GGUF.version"),
        fields.pop("GGUF.tensor_count"),
        fields.pop("GGUF.kv_count"),
    )
    assert list(ours.metadata) == list(fields)
    for key, value in fields.items():
        assert typed(ours.metadata[key]) == typed(value), key
    assert list(ours.tensors) == [t.name for t in reader.tensors]
    for expected in reader.tensors:
        t = ours.tensors[expected.name]
        assert (t.tensor_type, t.shape) == (expected.tensor_type, tuple(int(d) for d in expected.shape)), t.name
        assert (t.data.dtype, t.data.shape) == (expected.data.dtype, expected.data.shape), t.name
        assert np.array_equal(t.data.view(np.uint8), expected.data.view(np.uint8)), t.name


# -- every value type, written by gguf-py's GGUFWriter ----------------------------------------------
SCALARS = {
    "v.u8": (V.UINT8, 255),
    "v.i8": (V.INT8, -128),
    "v.u16": (V.UINT16, 65535),
    "v.i16": (V.INT16, -32768),
    "v.u32": (V.UINT32, 2**32 - 1),
    "v.i32": (V.INT32, -(2**31)),
    "v.f32": (V.FLOAT32, 0.1),  # read back as float32's nearest: 0.10000000149011612
    "v.bool": (V.BOOL, True),
    "v.str": (V.STRING, "héllo, 世界"),
    "v.empty_str": (V.STRING, ""),
    "v.u64": (V.UINT64, 2**64 - 1),
    "v.i64": (V.INT64, -(2**63)),
    "v.f64": (V.FLOAT64, 0.1),
}
ARRAYS = {
    "a.i32": (V.INT32, [1, -2, 3]),
    "a.f32": (V.FLOAT32, [0.25, -1.5]),
    "a.bool": (V.BOOL, [True, False, True]),
    "a.u64": (V.UINT64, [2**64 - 1, 0]),
    "a.str": (V.STRING, ["<pad>", "", "▁世界", "a b"]),
    "a.nested": (V.ARRAY, [[1, 2], [3]]),  # gguf-py's writer makes the inner arrays INT32
}
F32_ROWS = np.arange(16, dtype=np.float32).reshape(2, 8)
F16_ROWS = np.linspace(-1, 1, 8, dtype=np.float16).reshape(2, 4)
I32_VECTOR = np.array([7, -7, 2**31 - 1], np.int32)
Q8_ROWS = gguf.quants.quantize(np.linspace(-2, 2, 128, dtype=np.float32).reshape(2, 64), T.Q8_0)
LAST = np.ones((4, 8), np.float32)  # 128 bytes: the file ends where its data does, with no padding


def write_gguf(path: Path, alignment: int | None = None, endianess: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    writer = gguf.GGUFWriter(str(path), "test", endianess=endianess)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, (vtype, value) in SCALARS.items():
        writer.add_key_value(key, value, vtype)
    for key, (vtype, value) in ARRAYS.items():
        writer.add_key_value(key, value, V.ARRAY, sub_type=vtype)
    writer.add_tensor("q8", Q8_ROWS, raw_dtype=T.Q8_0)
    writer.add_tensor("f16", F16_ROWS)
    writer.add_tensor("i32", I32_VECTOR)
    writer.add_tensor("f32", F32_ROWS)
    writer.add_tensor("last", LAST)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64, 128])
def test_every_value_type_and_tensor_reads_back(tmp_path, alignment):
    contents = read_gguf(write_gguf(tmp_path / "all.gguf", alignment))
    assert contents.version == 3
    expected_scalars = {key: value for key, (_, value) in SCALARS.items()} | {"v.f32": 0.10000000149011612}
    expected = {"general.architecture": "test"} | ({"general.alignment": alignment} if alignment else {})
    expected |= expected_scalars | {key: value for key, (_, value) in ARRAYS.items()}
    assert {key: typed(value) for key, value in contents.metadata.items()} == {
        key: typed(value) for key, value in expected.items()
    }
    assert list(contents.tensors) == ["q8", "f16", "i32", "f32", "last"]
    q8 = contents.tensors["q8"]
    assert (q8.tensor_type, q8.shape, q8.data.dtype, q8.data.shape) == (T.Q8_0, (64, 2), np.uint8, (2, 68))
    np.testing.assert_array_equal(q8.data, Q8_ROWS)
    for name, array, ggml_type in [
        ("f16", F16_ROWS, T.F16),
        ("i32", I32_VECTOR, T.I32),
        ("f32", F32_ROWS, T.F32),
        ("last", LAST, T.F32),
    ]:
        t = contents.tensors[name]
        assert (t.tensor_type, t.shape, t.data.dtype) == (ggml_type, tuple(reversed(array.shape)), array.dtype), name
        np.testing.assert_array_equal(t.data, array, err_msg=name)
        assert not t.data.flags.writeable


# -- values only a hand-packed file holds -----------------------------------------------------------
def pack_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def pack_key(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return pack_string(key) + struct.pack("<I", vtype) + payload


def pack_array(item_type: int, count: int, items: bytes = b"") -> bytes:
    return struct.pack("<IQ", item_type, count) + items


def pack_tensor(name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return pack_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


def pack_gguf(keys: list[bytes], tensors: list[bytes] = [], data: bytes = b"", version: int = 3) -> bytes:  # noqa: B006
    header = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(keys)) + b"".join(keys) + b"".join(tensors)
    return header + bytes(-len(header) % 32) + data


def test_empty_arrays_and_a_version_2_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(
        pack_gguf(
            [
                pack_key("e.u32", V.ARRAY, pack_array(V.UINT32, 0)),
                pack_key("e.str", V.ARRAY, pack_array(V.STRING, 0)),
                pack_key(
                    "e.nested", V.ARRAY, pack_array(V.ARRAY, 2, pack_array(V.INT8, 0) + pack_array(V.STRING, 1, pack_string("x")))
                ),
            ],
            [pack_tensor("w", (4,), T.F32, 0)],
            np.arange(4, dtype="<f4").tobytes(),
            version=2,
        )
    )
    contents = read_gguf(path)
    assert (contents.version, contents.metadata) == (2, {"e.u32": [], "e.str": [], "e.nested": [[], ["x"]]})
    np.testing.assert_array_equal(contents.tensors["w"].data, [0, 1, 2, 3])


# -- bad files ----------------------------------------------------------------------------------------
W = [pack_tensor("w", (32,), T.F32, 0)]
W_DATA = bytes(128)
ALIGN = "general.alignment"
BAD = {
    "unknown value type": ([pack_key("k", 13, b"")], [], "k has the unknown value type 13"),
    "key not UTF-8": ([pack_key(b"\xff\xfe", V.UINT8, b"\x01")], [], "a key at byte 32 is not UTF-8"),
    "string item not UTF-8": (
        [pack_key("tokens", V.ARRAY, pack_array(V.STRING, 2, pack_string("ok") + pack_string(b"\xc3")))],
        [],
        "tokens\\[1\\] at byte \\d+ is not UTF-8",
    ),
    "key twice": ([pack_key("k", V.UINT8, b"\x01"), pack_key("k", V.UINT8, b"\x02")], [], "key k appears twice"),
    "alignment 0": ([pack_key(ALIGN, V.UINT32, struct.pack("<I", 0))], W, "general.alignment 0 is not a u32 power of two"),
    "alignment 48": ([pack_key(ALIGN, V.UINT32, struct.pack("<I", 48))], W, "general.alignment 48 is not"),
    "alignment as u64": ([pack_key(ALIGN, V.UINT64, struct.pack("<Q", 32))], W, "general.alignment 32 is not a u32"),
    "unknown tensor type": ([], [pack_tensor("w", (32,), 99, 0)], "tensor w has the unknown type 99"),
    "five dimensions": ([], [pack_tensor("w", (1, 1, 1, 1, 32), T.F32, 0)], "tensor w has 5 dimensions"),
    "rows not whole blocks": ([], [pack_tensor("w", (33,), T.Q8_0, 0)], "tensor w: Quantized tensor row size \\(33\\)"),
    "quantized scalar": ([], [pack_tensor("w", (), T.Q8_0, 0)], "tensor w of type Q8_0 has no dimensions"),
    "tensor twice": ([], W + W, "tensor w appears twice"),
    "data past the end": (
        [],
        [pack_tensor("w", (32,), T.F32, 64)],
        "the data of tensor w \\(byte \\d+, 128 bytes\\) runs past the end",
    ),
    "huge tensor": ([], [pack_tensor("w", (2**40, 2**40), T.F32, 0)], "the data of tensor w .* runs past the end"),
    "huge string": (
        [pack_key("k", V.STRING, struct.pack("<Q", 2**63))],
        [],
        "k \\(byte \\d+, 9223372036854775808 bytes\\) runs past",
    ),
    "huge array": ([pack_key("k", V.ARRAY, pack_array(V.UINT64, 2**61))], [], "k \\(byte \\d+, 18446744073709551616 bytes\\)"),
    "huge string array": (
        [pack_key("k", V.ARRAY, pack_array(V.STRING, 2**62))],
        [],
        "the length of k\\[17\\] \\(byte 185, 8 bytes\\) runs past",
    ),
    "nine nested arrays": (
        [pack_key("k", V.ARRAY, pack_array(V.ARRAY, 1) * 9 + pack_array(V.UINT8, 0))],
        [],
        "k nests arrays more than 8 deep",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_corrupt_file_is_refused_saying_what_is_wrong(tmp_path, case):
    keys, tensors, message = BAD[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(pack_gguf(keys, tensors, W_DATA))
    with pytest.raises(ModelSourceError, match=f"bad.gguf {CORRUPT}: {message}"):
        read_gguf(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", f"{CORRUPT}: the file is 0 bytes long"),
        (b"GGU", f"{CORRUPT}: the file is 3 bytes long"),
        (
            b"PK\x03\x04" + bytes(60),
            "is not a GGUF file \\(it begins with b'PK\\\\x03\\\\x04', not b'GGUF'\\); pass a .gguf model file",
        ),
        (pack_gguf([], version=1), "is GGUF version 1; WiCore reads versions 2 and 3"),
        (pack_gguf([], version=4), "is GGUF version 4; WiCore reads versions 2 and 3"),
    ],
    ids=["empty", "three bytes", "zip", "version 1", "version 4"],
)
def test_a_file_that_is_not_a_gguf_it_can_read_is_refused(tmp_path, data, message):
    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelSourceError, match=message):
        read_gguf(path)


def test_a_big_endian_file_is_refused_saying_how_to_convert_it(tmp_path):
    path = write_gguf(tmp_path / "be.gguf", endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(ModelSourceError, match="be.gguf is a big-endian GGUF, which WiCore does not read; .* little"):
        read_gguf(path)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(ModelSourceError, match="cannot be read"):
        read_gguf(tmp_path)


@pytest.mark.slow  # 2 s on the 2-core VM, loaded
def test_every_truncation_is_refused(tmp_path):
    """Cut after any byte before the end of the last tensor, the file is refused as truncated."""
    data = write_gguf(tmp_path / "all.gguf").read_bytes()
    read_gguf(tmp_path / "all.gguf")
    cut = tmp_path / "cut.gguf"
    for size in range(4, len(data)):
        cut.write_bytes(data[:size])
        with pytest.raises(ModelSourceError, match=CORRUPT):
            read_gguf(cut)


@pytest.mark.slow  # 6 s on the 2-core VM, loaded
def test_any_byte_of_the_header_flipped_reads_or_is_refused(tmp_path):
    """No flipped byte lets an IndexError, struct.error, OverflowError... out: the file either reads
    (a changed value) or raises ModelSourceError."""
    data = bytearray(write_gguf(tmp_path / "all.gguf", alignment=64).read_bytes())
    header_size = len(data) - sum(a.nbytes for a in (Q8_ROWS, F16_ROWS, I32_VECTOR, F32_ROWS, LAST))
    flipped = tmp_path / "flipped.gguf"
    for position in range(header_size):
        for mask in (0x01, 0x80, 0xFF):
            data[position] ^= mask
            flipped.write_bytes(data)
            try:
                read_gguf(flipped)
            except ModelSourceError:
                pass
            data[position] ^= mask
