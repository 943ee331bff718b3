"""Partition planning and the manifest's integrity checks."""

from __future__ import annotations

import json

import pytest

from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import ManifestError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph import manifest as manifest_module
from wicore.graph.manifest import VERIFIED, Manifest
from wicore.graph.partition import plan_partitions


@pytest.mark.parametrize(
    ("layers", "n", "ranges"),
    [
        (18, 1, [(0, 18)]),
        (18, 3, [(0, 6), (6, 12), (12, 18)]),
        (18, 4, [(0, 4), (4, 9), (9, 14), (14, 18)]),
        (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
        (62, 5, [(0, 12), (12, 25), (25, 38), (38, 50), (50, 62)]),
    ],
)
def test_plan_partitions(layers, n, ranges):
    specs = plan_partitions(layers, n)
    assert [(s.start, s.stop) for s in specs] == ranges
    assert [s.has_embedding for s in specs] == [True] + [False] * (n - 1)
    assert [s.has_lm_head for s in specs] == [False] * (n - 1) + [True]


def open_engine(folder) -> None:
    """Open (and close) an engine on `folder`: it checks the files against wicore.json first."""
    with Engine(EngineConfig(model_dir=folder, num_threads=1, block_size=4, num_device_blocks=8, num_host_blocks=0)):
        pass


@pytest.fixture
def exported(tiny_model, tmp_path):
    folder, _ = tiny_model()
    out = tmp_path / "m"
    export_model(open_source(str(folder)), out, ExportConfig(num_partitions=2), progress=lambda _: None)
    return out


def test_manifest_records_partitions_and_io(exported):
    m = Manifest.read(exported)
    assert [(p.file, p.start, p.stop) for p in m.partitions] == [("part-00.onnx", 0, 2), ("part-01.onnx", 2, 4)]
    first, last = m.partitions
    assert first.inputs[:5] == ("input_ids", "positions", "slot_mapping", "block_tables", "context_lens")
    assert "key_cache.0" in first.inputs and "value_cache_out.1" in first.outputs
    assert first.outputs[-1] == "hidden_states_out" and last.outputs[-2:] == ("logits", "greedy_tokens")
    assert last.inputs[0] == "hidden_states" and "logits_indices" in last.inputs
    assert set(m.files) == {"embed_tokens.data", "part-00.onnx", "part-00.onnx.data", "part-01.onnx", "part-01.onnx.data"}
    raw = json.loads((exported / "wicore.json").read_text())
    assert raw["kv"]["layout"] == ["num_blocks", "block_size", "num_kv_heads", "head_dim"]
    assert raw["source"]["kind"] == "hf" and raw["op_flavour"] == "portable" and raw["dtype"] == "fp32"
    assert raw["attention"] == "portable" and m.attention == "portable"


def test_tampered_partition_is_refused_by_name(exported):
    data = exported / "part-01.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(ManifestError, match=r"part-01\.onnx\.data does not match its sha256"):
        open_engine(exported)


def test_files_are_hashed_again_only_where_they_changed(exported, monkeypatch):
    hashed: list[str] = []
    plain = manifest_module.sha256_file

    def counting(path, chunk=1 << 22):
        hashed.append(path.name)
        return plain(path, chunk)

    monkeypatch.setattr(manifest_module, "sha256_file", counting)
    m = Manifest.read(exported)
    m.verify(exported)
    assert sorted(hashed) == sorted(m.files) and (exported / VERIFIED).is_file()
    hashed.clear()
    m.verify(exported)  # nothing changed since the files passed: nothing read
    assert hashed == []
    embed = exported / "embed_tokens.data"
    embed.write_bytes(embed.read_bytes())  # the same bytes, written again: hashed again, and they pass
    m.verify(exported)
    assert hashed == ["embed_tokens.data"]


def test_a_file_changed_after_it_passed_is_refused(exported):
    open_engine(exported)  # passes, and leaves the files' stamps
    data = exported / "part-00.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(ManifestError, match=r"part-00\.onnx\.data does not match its sha256"):
        open_engine(exported)


def test_a_damaged_stamp_file_only_costs_a_hash(exported):
    (exported / VERIFIED).write_text("{not json")
    open_engine(exported)
    assert set(json.loads((exported / VERIFIED).read_text())) == set(Manifest.read(exported).files)


def test_missing_partition_is_refused_by_name(exported):
    (exported / "part-00.onnx").unlink()
    with pytest.raises(ManifestError, match=r"part-00\.onnx is missing"):
        open_engine(exported)


def test_folder_without_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no wicore.json"):
        Manifest.read(tmp_path)
