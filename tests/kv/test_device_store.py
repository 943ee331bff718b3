"""OrtPoolStore copies blocks in and out of OrtValue pools exactly and in place (CPU EP here)."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.blocks.block_pool import Move
from wicore.blocks.tier import Tier
from wicore.devices.providers import CAPABILITIES, Device, onnxruntime
from wicore.kv.device_store import LayerSplitStore, OrtPoolStore, ort_pool_store
from wicore.kv.pager import Pager
from wicore.kv.tiers import BatchedTierStore, DeviceStore, HostStore, NvmeStore

LAYERS, NUM_BLOCKS, BLOCK, HEADS, DIM = 3, 6, 4, 2, 8
SHAPE = (LAYERS, 2, BLOCK, HEADS, DIM)
CPU = Device(CAPABILITIES["cpu"], "0")


def random_pools(dtype: np.dtype, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    pools = [rng.standard_normal((NUM_BLOCKS, BLOCK, HEADS, DIM)).astype(dtype) for _ in range(2 * LAYERS)]
    return pools[0::2], pools[1::2]


def as_ort_values(keys: list[np.ndarray], values: list[np.ndarray]) -> list[tuple[object, object]]:
    ort = onnxruntime()
    return [
        (ort.OrtValue.ortvalue_from_numpy(k, "cpu", 0), ort.OrtValue.ortvalue_from_numpy(v, "cpu", 0))
        for k, v in zip(keys, values)
    ]


def block(seed: int, dtype: np.dtype, n: int | None = None) -> np.ndarray:
    shape = SHAPE if n is None else (n, *SHAPE)
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.fixture(params=[np.float32, np.float16], ids=["fp32", "fp16"])
def pools(request):
    """(host arrays backing the OrtValues, an OrtPoolStore over them, NumPy's DeviceStore over them)."""
    dtype = np.dtype(request.param)
    keys, values = random_pools(dtype)
    ort_values = as_ort_values(keys, values)  # kept alive by the store
    return keys, values, OrtPoolStore(ort_values, dtype, CPU), DeviceStore(keys, values)


def test_reads_match_numpy(pools):
    keys, values, store, truth = pools
    assert store.num_frames == NUM_BLOCKS and isinstance(store, BatchedTierStore)
    for frame in (0, 2, NUM_BLOCKS - 1):
        got = store.read(frame)
        assert got.shape == SHAPE and got.dtype == keys[0].dtype
        assert got.tobytes() == truth.read(frame).tobytes()
        assert np.array_equal(got[1, 0], keys[1][frame]) and np.array_equal(got[2, 1], values[2][frame])
    many = store.read_many([NUM_BLOCKS - 1, 0, 3, 0])
    assert many.shape == (4, *SHAPE)
    for got, frame in zip(many, [NUM_BLOCKS - 1, 0, 3, 0]):
        assert got.tobytes() == truth.read(frame).tobytes()
    assert store.read_many([]).shape == (0, *SHAPE)


def test_write_is_in_place_and_round_trips_bit_exact(pools):
    keys, values, store, truth = pools
    before = [p.copy() for p in keys + values]
    data = block(1, keys[0].dtype)
    store.write(NUM_BLOCKS - 1, data)
    assert np.array_equal(keys[0][NUM_BLOCKS - 1], data[0, 0])  # the NumPy array behind the OrtValue
    assert np.array_equal(values[2][NUM_BLOCKS - 1], data[2, 1])
    assert store.read(NUM_BLOCKS - 1).tobytes() == data.tobytes()
    for now, then in zip(keys + values, before):  # nothing else moved
        assert np.array_equal(now[: NUM_BLOCKS - 1], then[: NUM_BLOCKS - 1])
    store.write(0, data * 2)
    assert truth.read(0).tobytes() == (data * 2).tobytes()


def test_batched_write_then_read(pools):
    keys, values, store, truth = pools
    before = [p.copy() for p in keys + values]
    data = block(2, keys[0].dtype, n=3)
    store.write_many([4, 0, NUM_BLOCKS - 1], data)
    assert store.read_many([0, 4, NUM_BLOCKS - 1]).tobytes() == data[[1, 0, 2]].tobytes()
    assert truth.read(4).tobytes() == data[0].tobytes()
    for now, then in zip(keys + values, before):
        assert np.array_equal(now[[1, 2, 3]], then[[1, 2, 3]])
    store.write_many([], data[:0])
    store.write_many([3, 1, 2], data * 3)  # one run of consecutive frames, given out of order
    assert store.read_many([1, 2, 3]).tobytes() == (data * 3)[[1, 2, 0]].tobytes()
    assert truth.read(4).tobytes() == data[0].tobytes()


def test_bad_frames_and_shapes_raise(pools):
    keys, _, store, _ = pools
    data = block(3, keys[0].dtype)
    with pytest.raises(IndexError, match=f"frame {NUM_BLOCKS} is out of range for a device pool of {NUM_BLOCKS} blocks"):
        store.read(NUM_BLOCKS)
    with pytest.raises(IndexError, match="frame -1 is out of range"):
        store.write(-1, data)
    with pytest.raises(IndexError, match="frame 9 is out of range"):
        store.read_many([0, 9])
    with pytest.raises(ValueError, match="got a frame twice"):
        store.write_many([1, 1], np.stack([data, data]))
    with pytest.raises(ValueError, match="blocks of shape"):
        store.write(1, data[:2])
    before = [k.copy() for k in keys]
    with pytest.raises(IndexError):
        store.write_many([2, NUM_BLOCKS], np.stack([data, data]))
    assert all(np.array_equal(k, b) for k, b in zip(keys, before))  # a refused batch writes nothing


def test_layers_on_several_devices_join_along_the_layer_axis():
    keys, values = random_pools(np.dtype(np.float32), seed=4)
    other = Device(CAPABILITIES["cpu"], "1")  # another device as far as grouping goes
    store = ort_pool_store(as_ort_values(keys, values), [CPU, other, other], np.dtype(np.float32))
    assert isinstance(store, LayerSplitStore) and [s.num_layers for s in store.stores] == [1, 2]
    truth = DeviceStore(keys, values)
    assert store.read(5).tobytes() == truth.read(5).tobytes()
    data = block(5, np.float32, n=2)
    store.write_many([0, 5], data)
    assert truth.read(0).tobytes() == data[0].tobytes() and truth.read(5).tobytes() == data[1].tobytes()
    assert isinstance(ort_pool_store(as_ort_values(keys, values), [CPU] * 3, np.dtype(np.float32)), OrtPoolStore)


class CountingStore(OrtPoolStore):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.calls: list[tuple[str, list[int]]] = []

    def read_many(self, frames):
        self.calls.append(("read", list(frames)))
        return super().read_many(frames)

    def write_many(self, frames, data):
        self.calls.append(("write", list(frames)))
        super().write_many(frames, data)


@pytest.fixture
def tiers(tmp_path):
    dtype = np.dtype(np.float32)
    keys, values = random_pools(dtype, seed=6)
    nvme = NvmeStore(tmp_path / "kv.bin", 4, SHAPE, dtype)
    device = CountingStore(as_ort_values(keys, values), dtype, CPU)
    yield {Tier.DEVICE: device, Tier.HOST: HostStore(4, SHAPE, dtype), Tier.NVME: nvme}, DeviceStore(keys, values)
    nvme.close()


def test_pager_batches_runs_and_keeps_plan_order(tiers):
    stores, truth = tiers
    original = [truth.read(s) for s in range(NUM_BLOCKS)]
    # Demote device 1, 2 to host (one run); promote host 3's block into the vacated device 1;
    # push host 0 down to NVMe, then reuse host 0 for device 4 (runs of one pair batch again).
    stores[Tier.HOST].write(3, block(7, np.float32))
    plan = [
        Move(1, (Tier.DEVICE, 1), (Tier.HOST, 0)),
        Move(2, (Tier.DEVICE, 2), (Tier.HOST, 1)),
        Move(3, (Tier.HOST, 3), (Tier.DEVICE, 1)),
        Move(1, (Tier.HOST, 0), (Tier.NVME, 0)),
        Move(4, (Tier.DEVICE, 4), (Tier.HOST, 0)),
        Move(5, (Tier.DEVICE, 5), (Tier.HOST, 2)),
    ]
    pager = Pager(stores)
    assert pager.execute(plan) == set()
    assert stores[Tier.DEVICE].calls == [("read", [1, 2]), ("write", [1]), ("read", [4, 5])]
    assert truth.read(1).tobytes() == block(7, np.float32).tobytes()
    assert stores[Tier.NVME].read(0).tobytes() == original[1].tobytes()
    assert stores[Tier.HOST].read(0).tobytes() == original[4].tobytes()
    assert stores[Tier.HOST].read(1).tobytes() == original[2].tobytes()
    assert stores[Tier.HOST].read(2).tobytes() == original[5].tobytes()
    assert pager.stats.num_moves == {("device", "host"): 4, ("host", "device"): 1, ("host", "nvme"): 1}


def test_pager_cuts_a_run_that_writes_a_frame_twice(tiers):
    stores, truth = tiers
    stores[Tier.HOST].write(0, block(8, np.float32))
    stores[Tier.HOST].write(1, block(9, np.float32))
    Pager(stores).execute([Move(1, (Tier.HOST, 0), (Tier.DEVICE, 3)), Move(2, (Tier.HOST, 1), (Tier.DEVICE, 3))])
    assert stores[Tier.DEVICE].calls == [("write", [3]), ("write", [3])]
    assert truth.read(3).tobytes() == block(9, np.float32).tobytes()  # the later move wins


def test_pager_skips_corrupt_blocks_in_a_batch(tiers):
    stores, truth = tiers
    before = truth.read(1)
    stores[Tier.NVME].write(0, block(10, np.float32))
    stores[Tier.NVME].write(1, block(11, np.float32))
    with open(stores[Tier.NVME].path, "r+b") as f:  # frame 0's first byte flipped, behind the store's back
        value = f.read(1)[0]
        f.seek(0)
        f.write(bytes([value ^ 0x40]))
    pager = Pager(stores)
    assert pager.execute([Move(10, (Tier.NVME, 0), (Tier.DEVICE, 1)), Move(11, (Tier.NVME, 1), (Tier.DEVICE, 2))]) == {10}
    assert stores[Tier.DEVICE].calls == [("write", [2])]
    assert truth.read(1).tobytes() == before.tobytes()
    assert truth.read(2).tobytes() == block(11, np.float32).tobytes()
    assert pager.stats.num_corrupt == 1


def test_a_run_is_cut_before_reading_a_frame_it_wrote():
    from wicore.kv.pager import _batches

    chain = [
        Move(1, (Tier.DEVICE, 1), (Tier.DEVICE, 2)),
        Move(2, (Tier.DEVICE, 2), (Tier.DEVICE, 3)),
        Move(3, (Tier.DEVICE, 4), (Tier.DEVICE, 1)),
    ]
    assert [[m.block_id for m in b] for b in _batches(chain)] == [[1], [2, 3]]


def test_engine_swaps_through_ort_pool_stores_losslessly(tiny_export, tmp_path):
    """The engine's tier 0 forced to OrtPoolStore (as when pools sit in GPU memory): requests
    swapped out and back, and prefixes demoted to host and NVMe and promoted again, generate
    what they generate with a roomy pool."""
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.engine.scheduler import SchedulerConfig
    from wicore.types.sampling import SamplingParams

    model_dir = tiny_export(2)[0]
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 512, int(n)).tolist() for n in rng.integers(3, 60, 12)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)

    def run(**tiers) -> tuple[list[list[int]], dict, list[str]]:
        config = EngineConfig(
            model_dir=model_dir,
            num_threads=1,
            block_size=4,
            nvme_dir=tmp_path,
            scheduler=SchedulerConfig(max_num_batched_tokens=48, prefill_chunk=16),
            **tiers,
        )
        with Engine(config) as eng:
            buffers = eng.core.runner.graphs.buffers
            layouts = [layers for layers in (eng.layout.full_layers, eng.layout.window_layers) if layers]
            for layers, pager in zip(layouts, eng.core.kv.pagers):
                assert isinstance(pager.stores[Tier.DEVICE], DeviceStore)  # what a CPU engine picks itself
                pager.stores[Tier.DEVICE] = ort_pool_store(
                    [buffers.values(i) for i in layers], [buffers.layer_devices[i] for i in layers], buffers.dtype
                )
            outputs = []
            for _ in range(2):  # the second round finds its prompts cached, some demoted to NVMe
                ids = [eng.add_request(p, params) for p in prompts]  # all queued first: no timing in the load
                eng.start()
                outputs += [[t for out in eng.outputs(i) for t in out.new_token_ids] for i in ids]
            moves: dict = {}
            for pager in eng.core.kv.pagers:
                for key, n in pager.stats.num_moves.items():
                    moves[key] = moves.get(key, 0) + n
            return outputs, eng.stats(), moves

    roomy, _, _ = run(num_device_blocks=256, num_host_blocks=0, num_nvme_blocks=0)
    tight, stats, moves = run(num_device_blocks=41, num_host_blocks=24, num_nvme_blocks=400)
    assert tight == roomy
    assert stats.preempted_swap > 0 and stats.corrupt_blocks == 0
    assert all(moves.get(pair, 0) > 0 for pair in (("device", "host"), ("host", "device"), ("host", "nvme"), ("nvme", "device")))
