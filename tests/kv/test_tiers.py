"""Tier stores copy exactly; NVMe detects corruption; the pager follows plans in order."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from wicore.blocks.block_pool import Move
from wicore.blocks.tier import Tier
from wicore.errors import WiCoreError
from wicore.kv.pager import Pager
from wicore.kv.tiers import CorruptBlockError, DeviceStore, HostStore, NvmeStore

LAYERS, BLOCK, HEADS, DIM = 3, 4, 2, 8
SHAPE = (LAYERS, 2, BLOCK, HEADS, DIM)


def frame(pool, block_id: int) -> int:
    """The frame the block lies in (in whichever tier)."""
    return next(b.frame for b in pool.blocks() if b.block_id == block_id)


def tamper(store: NvmeStore, frame: int, byte: int = 0) -> None:
    """Flip one byte of a frame in the file, behind the store's back."""
    with open(store.path, "r+b") as f:
        f.seek(frame * store.frame_bytes + byte)
        value = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([value ^ 0x40]))


def block(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


@pytest.fixture
def stores(tmp_path):
    keys = [np.zeros((6, BLOCK, HEADS, DIM), np.float32) for _ in range(LAYERS)]
    values = [np.zeros((6, BLOCK, HEADS, DIM), np.float32) for _ in range(LAYERS)]
    nvme = NvmeStore(tmp_path / "kv.bin", 4, SHAPE, np.dtype(np.float32))
    yield {Tier.DEVICE: DeviceStore(keys, values), Tier.HOST: HostStore(4, SHAPE, np.dtype(np.float32)), Tier.NVME: nvme}
    nvme.close()


def test_device_store_reads_and_writes_the_bound_pools(stores):
    dev = stores[Tier.DEVICE]
    data = block(1)
    dev.write(3, data)
    assert np.array_equal(dev.key_pools[1][3], data[1, 0])
    assert np.array_equal(dev.value_pools[2][3], data[2, 1])
    assert np.array_equal(dev.read(3), data)
    assert not dev.read(2).any()


def test_round_trip_through_every_tier_is_bit_exact(stores):
    data = block(2)
    stores[Tier.DEVICE].write(1, data)
    plan = [
        Move(7, (Tier.DEVICE, 1), (Tier.HOST, 2)),
        Move(7, (Tier.HOST, 2), (Tier.NVME, 3)),
        Move(7, (Tier.NVME, 3), (Tier.DEVICE, 5)),
    ]
    assert Pager(stores).execute(plan) == set()
    assert stores[Tier.DEVICE].read(5).tobytes() == data.tobytes()


def test_corrupt_nvme_block_is_detected(stores):
    nvme = stores[Tier.NVME]
    nvme.write(1, block(3))
    tamper(nvme, 1, byte=777)  # one byte, behind the store's back
    with pytest.raises(CorruptBlockError, match="frame 1"):
        nvme.read(1)
    with pytest.raises(CorruptBlockError):
        nvme.read(0)  # never written


def test_pager_reports_corrupt_blocks_and_leaves_their_destination(stores):
    stores[Tier.NVME].write(0, block(4))
    stores[Tier.NVME].write(1, block(5))
    tamper(stores[Tier.NVME], 0)
    pager = Pager(stores)
    bad = pager.execute([Move(10, (Tier.NVME, 0), (Tier.DEVICE, 1)), Move(11, (Tier.NVME, 1), (Tier.DEVICE, 2))])
    assert bad == {10}
    assert not stores[Tier.DEVICE].read(1).any()
    assert np.array_equal(stores[Tier.DEVICE].read(2), block(5))
    assert pager.stats.num_corrupt == 1


def test_dropped_blocks_copy_nothing(stores):
    stores[Tier.HOST].write(0, block(6))
    pager = Pager(stores)
    assert pager.execute([Move(3, (Tier.HOST, 0), None)]) == set()
    assert pager.stats.num_moves == {("host", "dropped"): 1}


def test_a_pool_plan_with_swaps_through_the_sink_moves_every_block_intact(stores):
    """A real BlockPool plan executed on real stores: each block's bytes end where the pool
    says the block is, through the promotions that pass the DEVICE sink frame."""
    from wicore.blocks.block_pool import BlockPool
    from wicore.blocks.policy import LRUPolicy

    now = [0.0]
    pool = BlockPool(6, 4, 4, BLOCK, LRUPolicy(), clock=lambda: now[0])
    truth = {}

    def execute(moves):
        assert Pager(stores).execute(moves) == set()

    for seq in range(12):  # one-block prompts: fill DEVICE, then cascade down to HOST and NVME
        now[0] = float(seq)
        prompt = [seq] * BLOCK + [99]
        alloc = pool.allocate(seq, prompt)
        execute(alloc.moves)
        block_id = pool.block_ids(seq)[0]
        truth[block_id] = block(100 + seq)
        stores[Tier.DEVICE].write(frame(pool, block_id), truth[block_id])
        pool.commit(seq, prompt, BLOCK)
        pool.free(seq)
    holder = list(range(1000, 1000 + BLOCK * pool.num_free(Tier.DEVICE)))
    execute(pool.allocate(500, holder).moves)  # takes every free DEVICE frame: hits must evict
    assert pool.num_free(Tier.DEVICE) == 0
    num_through_sink = 0
    num_hits = 0
    for seq in range(12):  # hits on the blocks still cached, most demoted below DEVICE
        prompt = [seq] * BLOCK + [7]
        if not pool.is_cached(pool.prefix_hashes(prompt)[0]):
            continue
        now[0] += 1
        alloc = pool.allocate(100 + seq, prompt)
        assert alloc.num_cached_tokens == BLOCK
        num_hits += 1
        num_through_sink += sum(m.dst == (Tier.DEVICE, BlockPool.SINK_SLOT) for m in alloc.moves)
        execute(alloc.moves)
        pool.free(100 + seq)
    assert num_hits >= 6 and num_through_sink > 0
    checked = 0
    for info in pool.blocks():
        if info.block_id in truth:
            assert np.array_equal(stores[info.tier].read(info.frame), truth[info.block_id]), info
            checked += 1
    assert checked >= 8


def test_kv_cache_drops_a_block_found_corrupt_and_names_the_sequence_that_lost_it(stores):
    """KVCache.execute: a sequence swapped out to NVMe (no host tier) comes back with one block
    corrupted there. The good blocks arrive intact, the corrupt one leaves the prefix cache,
    and the sequence is named so that the scheduler recomputes it."""
    from wicore.blocks.block_pool import BlockPool
    from wicore.blocks.policy import LRUPolicy
    from wicore.kv.cache import KVCache

    pool = BlockPool(6, 0, 4, BLOCK, LRUPolicy())
    kv = KVCache([pool], [Pager(stores)])
    prompt = [*range(2 * BLOCK), 99]  # two full blocks and one token
    assert kv.execute(kv.allocate(1, prompt, 16).moves) == set()
    block_ids = kv.block_ids(1)
    truth = {b: block(20 + i) for i, b in enumerate(block_ids)}
    for b in block_ids:
        stores[Tier.DEVICE].write(frame(pool, b), truth[b])
    kv.commit(1, prompt, len(prompt))
    assert kv.execute(kv.swap_out(1)) == set()
    assert kv.num_blocks_in(1, Tier.NVME) == 3
    bad = block_ids[1]
    tamper(stores[Tier.NVME], frame(pool, bad))
    assert kv.execute(kv.swap_in(1)) == {1}
    assert kv.num_corrupt == 1
    hashes = pool.prefix_hashes(prompt)
    assert pool.is_cached(hashes[0]) and not pool.is_cached(hashes[1])
    for b in (block_ids[0], block_ids[2]):
        assert np.array_equal(stores[Tier.DEVICE].read(frame(pool, b)), truth[b])
    assert kv.holders({(0, bad)}) == {1}  # it keeps its reference until it is freed to recompute
    kv.free(1)
    assert kv.holders({(0, b) for b in block_ids}) == set() and bad not in {i.block_id for i in pool.blocks()}


def test_nvme_file_is_private_and_closing_removes_it(tmp_path):
    path = tmp_path / f"wicore-kv-{os.getpid()}-1-full.bin"
    path.write_bytes(b"old")
    path.chmod(0o644)  # an earlier file of the same name does not lend its mode
    store = NvmeStore(path, 3, SHAPE, np.dtype(np.float32))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store.write(1, np.ones(SHAPE, np.float32))
    np.testing.assert_array_equal(store.read(1), np.ones(SHAPE, np.float32))
    store.close()
    assert not path.exists()


def test_files_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    stale = tmp_path / f"wicore-kv-{int(dead.stdout)}-7-full.bin"
    mine = tmp_path / f"wicore-kv-{os.getpid()}-7-full.bin"
    other = tmp_path / "notes.bin"
    for path in (stale, mine, other):
        path.write_bytes(b"x")
    assert NvmeStore.remove_stale(tmp_path) == [stale]
    assert not stale.exists() and mine.exists() and other.exists()


def test_a_write_that_cannot_land_is_a_lost_block_the_cache_recomputes(stores):
    """Issue 35: a write the disk refuses (ENOSPC here, /dev/full under the file) leaves its frame
    unreadable, so swapping the sequence back in names it as lost (the scheduler recomputes it)
    instead of a memory-mapped page killing the process with SIGBUS."""
    from wicore.blocks.block_pool import BlockPool
    from wicore.blocks.policy import LRUPolicy
    from wicore.kv.cache import KVCache

    nvme = stores[Tier.NVME]
    nvme.write(3, block(30))
    full = os.open("/dev/full", os.O_WRONLY)
    saved = os.dup(nvme._fd)
    os.dup2(full, nvme._fd)  # every write from now on fails with ENOSPC
    os.close(full)
    try:
        pool = BlockPool(6, 0, 4, BLOCK, LRUPolicy())
        kv = KVCache([pool], [Pager(stores)])
        prompt = [*range(2 * BLOCK), 99]
        assert kv.execute(kv.allocate(1, prompt, 16).moves) == set()
        kv.commit(1, prompt, len(prompt))
        assert kv.execute(kv.swap_out(1)) == set()  # the writes fail quietly: nothing raised
        nvme.write(3, block(31))
        assert nvme.num_lost_writes == 4
    finally:
        os.dup2(saved, nvme._fd)
        os.close(saved)
    assert kv.execute(kv.swap_in(1)) == {1}  # lost: its holder recomputes
    assert kv.num_corrupt == 3
    with pytest.raises(CorruptBlockError):
        nvme.read(3)  # a frame whose new bytes never landed does not give its old block either


def test_the_tier_file_is_reserved_whole_at_start(tmp_path):
    store = NvmeStore(tmp_path / "kv.bin", 5, SHAPE, np.dtype(np.float32))
    size = 5 * LAYERS * 2 * BLOCK * HEADS * DIM * 4
    assert store.frame_bytes * 5 == size == os.stat(store.path).st_size
    assert os.stat(store.path).st_blocks * 512 >= size  # allocated, not a sparse file
    store.close()


def test_a_tier_larger_than_the_free_space_is_refused_and_leaves_no_file(tmp_path):
    import shutil

    frame_bytes = LAYERS * 2 * BLOCK * HEADS * DIM * 4
    too_many = shutil.disk_usage(tmp_path).free // frame_bytes + 1000
    with pytest.raises(
        WiCoreError, match=r"the NVMe KV tier needs [\d.]+ GiB but the NVMe KV tier folder .* has [\d.]+ GiB free"
    ):
        NvmeStore(tmp_path / "kv.bin", too_many, SHAPE, np.dtype(np.float32))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_a_folder_that_cannot_hold_the_tier_is_one_error_and_no_file(tmp_path, kind):
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"x")
    folder = blocker if kind == "a file" else blocker / "kv"
    with pytest.raises(WiCoreError, match=f"cannot use the NVMe KV tier folder {folder} \\(nvme_dir\\): Not a directory"):
        NvmeStore(folder / "kv.bin", 4, SHAPE, np.dtype(np.float32))
    assert [p.name for p in tmp_path.iterdir()] == ["blocker"] and blocker.read_bytes() == b"x"


def test_a_link_planted_where_the_tier_file_goes_is_never_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    link = tmp_path / f"wicore-kv-{os.getpid()}-9-full.bin"
    link.symlink_to(target)
    with pytest.raises(WiCoreError, match="exists and is not a file this server may replace"):
        NvmeStore(link, 4, SHAPE, np.dtype(np.float32))
    assert target.read_bytes() == b"keep me" and link.is_symlink()


@pytest.fixture
def small_filesystem(tmp_path):
    """An 8 MiB tmpfs (mounting needs root: skipped elsewhere)."""
    folder = tmp_path / "small"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_tier_the_filesystem_cannot_hold_is_refused_naming_its_free_space(small_filesystem):
    """The adversarial pass's case: a 0.3 GB tier on an 8 MiB filesystem was accepted (sparse), then SIGBUS."""
    frame_bytes = LAYERS * 2 * BLOCK * HEADS * DIM * 4
    with pytest.raises(WiCoreError, match=r"needs 0\.30 GiB but .* has 0\.01 GiB free: lower nvme_tier_gb"):
        NvmeStore(small_filesystem / "kv.bin", int(0.3 * (1 << 30)) // frame_bytes + 1, SHAPE, np.dtype(np.float32))
    assert list(small_filesystem.iterdir()) == []
    fits = NvmeStore(small_filesystem / "kv.bin", (6 << 20) // frame_bytes, SHAPE, np.dtype(np.float32))
    fits.write(0, block(1))
    np.testing.assert_array_equal(fits.read(0), block(1))
    fits.close()
