"""Steps in flight over groups of requests (wicore.engine.groups) on the tiny chat model cut into two
partitions: async scheduling's mixed workload (staggered arrivals, greedy, seeded and top-k rows, a
grammar, a penalty, stop tokens and strings, an abort, max_tokens) gives exactly the tokens and
endings of one step at a time, no request sends anything after its final output, and every block
comes back to the pool."""

from __future__ import annotations

import pytest
from test_async_scheduling import chat, drive, mixed  # noqa: F401 (fixtures)
from tiny_engine import tiny_config

from wicore.engine.core import EngineCore
from wicore.engine.groups import StepGroups
from wicore.engine.stats import TierCounts
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source


@pytest.fixture(scope="module")
def two_part_chat(tiny_chat, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_chat_2p") / "model"
    export_model(open_source(str(tiny_chat[1])), out, ExportConfig(num_partitions=2), progress=lambda _: None)
    return out


@pytest.mark.parametrize("num_host_blocks", [0, 64], ids=["plenty", "preempting"])
def test_groups_in_flight_give_the_same_tokens_and_free_every_block(two_part_chat, mixed, num_host_blocks):  # noqa: F811
    """Plenty of blocks, then few (requests preempted to the host tier and back, prefixes reused)."""
    blocks = dict(num_device_blocks=40, num_host_blocks=64) if num_host_blocks else dict(enable_prefix_cache=False)
    one = drive(two_part_chat, False, mixed, devices="cpu,cpu", pipeline_groups=1, **blocks)
    two = drive(two_part_chat, False, mixed, devices="cpu,cpu", pipeline_groups=2, **blocks)
    assert two.tokens == one.tokens
    assert two.ends == one.ends
    assert one.ends["aborted"] == "abort" and one.ends["stop-text"] == "abort" and one.ends["one-token"] == "length"
    assert one.ends["stop-token"] == "stop" and one.ends["json"] == "stop"
    assert (one.late, two.late) == ([], [])
    assert two.blocks_referenced_after == TierCounts()
    assert two.num_steps > one.num_steps  # two groups: more, smaller steps
    if num_host_blocks:  # the prefix cache keeps blocks, unreferenced
        assert two.num_preempted > 0
    else:
        assert two.blocks_free_after == two.blocks_free_before


def test_groups_are_one_a_device_when_asked_and_refuse_what_does_not_combine(two_part_chat, chat):  # noqa: F811
    assert tiny_config(chat).pipeline_groups == 1  # off by default
    core = EngineCore(tiny_config(two_part_chat, verify_files=False, devices="cpu,cpu", pipeline_groups=None))
    try:  # two partitions on one device: nothing to overlap, one step at a time
        assert core.config.pipeline_groups == 1 and core.runner.graphs.pipeline is None
    finally:
        core.close()
    core = EngineCore(tiny_config(chat, verify_files=False, pipeline_groups=2))
    try:  # one partition: nothing to overlap either
        assert core.config.pipeline_groups == 1
    finally:
        core.close()
    with pytest.raises(ValueError, match="pipeline_groups must be >= 1"):
        tiny_config(chat, pipeline_groups=0)
    with pytest.raises(ValueError, match="pipeline_groups > 1 does not combine with async_scheduling"):
        tiny_config(chat, pipeline_groups=2, async_scheduling=True)
    with pytest.raises(ValueError, match="at least 2 groups"):
        StepGroups(None, 1)  # type: ignore[arg-type]
