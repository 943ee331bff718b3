"""DecodeGraphs (wicore.executor.cuda_graphs) over two partitions with steps in flight: each
calling thread replays its own slot's buckets, the partitions' runs go through the pipeline's
workers, and every decode step gives the logits of the same step run uncaptured. On the CPU EP
the run options' graph ids are ignored, so what is checked is the buckets' bindings (inputs,
hidden states handed between partitions, outputs), the slots and the ordering, not a capture
(tools/bench_pipeline_gpu.py checks that on two cards: tokens equal to the uncaptured split)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto

from wicore.devices.micrographs import handoff_graph
from wicore.devices.providers import parse_device
from wicore.executor.batch import build_batch
from wicore.executor.graphs import ModelGraphs
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers

BS = 4


def _row(tokens: list[int], start: int, blocks: list[int], num_logits: int) -> SimpleNamespace:
    return SimpleNamespace(
        token_ids=tokens, start=start, block_table=blocks, window_table=blocks, window_first=0, num_logits=num_logits
    )


def _graphs(folder, groups: int) -> ModelGraphs:
    manifest = Manifest.read(folder)
    devices = [parse_device("cpu")] * len(manifest.partitions)
    buffers = KVBuffers(manifest, CacheConfig(16, BS), devices)
    return ModelGraphs(folder, manifest, buffers, devices, num_threads=1, micro_batch_tokens=0, pipeline_groups=groups)


def test_two_slots_replayed_from_two_threads_give_the_uncaptured_logits(tiny_export):
    """Two groups of requests (rows on blocks of their own), prefilled uncaptured, then three decode
    steps each, the groups' steps run at once from two threads through the decode graphs' two slots:
    each step's logits equal those of the same steps run one at a time without decode graphs."""
    folder, _ = tiny_export(2)
    prompts = {"a": ([5, 9, 33, 41, 7], [1, 2, 3]), "b": ([60, 61, 62], [4, 5, 6]), "c": ([8, 8, 9, 10, 11, 12, 13], [7, 8, 9])}
    groups = [["a", "b"], ["c"]]

    def decode(graphs: ModelGraphs, names: list[str], step: int, last: dict[str, int]) -> np.ndarray:
        rows = [_row([last[n]], len(prompts[n][0]) + step, prompts[n][1], 1) for n in names]
        out = graphs.run(build_batch(rows, BS))
        for n, token in zip(names, out.logits.argmax(-1).tolist()):
            last[n] = token
        return out.logits.copy()  # on the CPU a bucket's logits are a view of its output buffer

    def prefill(graphs: ModelGraphs) -> dict[str, int]:
        last = {}
        for n, (tokens, blocks) in prompts.items():
            last[n] = int(graphs.run(build_batch([_row(tokens, 0, blocks, 1)], BS)).logits.argmax(-1)[0])
        return last

    plain = _graphs(folder, 2)
    try:
        last = prefill(plain)
        want = {tuple(g): [decode(plain, g, step, last) for step in range(3)] for g in groups}
    finally:
        plain.close()

    graphs = _graphs(folder, 2)
    try:
        graphs.enable_decode_graphs(BS, 2, 4, 4, 16)
        decode_graphs = graphs.decode_graphs
        assert decode_graphs is not None and decode_graphs.num_slots == 2
        last = prefill(graphs)
        got: dict[tuple[str, ...], list[np.ndarray]] = {}
        barrier = threading.Barrier(len(groups))

        def group(names: list[str]) -> None:
            steps = []
            for step in range(3):
                barrier.wait()  # both groups' steps in flight at once
                steps.append(decode(graphs, names, step, last))
            got[tuple(names)] = steps

        threads = [threading.Thread(target=group, args=(g,)) for g in groups]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(decode_graphs._slot_of.values()) == [0, 1]  # one slot a thread
        for key, steps in want.items():
            for step, logits in enumerate(steps):
                np.testing.assert_allclose(got[key][step], logits, rtol=1e-5, atol=1e-5)
        with pytest.raises(RuntimeError, match="2 decode graph slots, all taken"):
            decode(graphs, ["a"], 3, dict(last))  # a third thread (this one) finds no slot
    finally:
        graphs.close()


class _Recorder:
    """A session whose runs record the thread they ran on, around an ONNX Runtime session."""

    def __init__(self, session, partition: int, runs: list[tuple[int, str]]) -> None:
        self._session, self._partition, self._runs = session, partition, runs

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def run_with_iobinding(self, binding, options=None) -> None:
        self._runs.append((self._partition, threading.current_thread().name))
        self._session.run_with_iobinding(binding, options)


def test_slots_are_captured_on_the_workers_that_replay_them(tiny_export):
    """The CUDA EP keeps captured graphs per thread: a graph captured on the thread that enables the
    decode graphs would not be found on the pipeline worker that replays it (which would capture its
    own, while other threads copy). So the up-front capture runs each partition on its worker, as
    the replays do."""
    folder, _ = tiny_export(2)
    graphs = _graphs(folder, 2)
    runs: list[tuple[int, str]] = []
    try:
        graphs.sessions = [_Recorder(s, i, runs) for i, s in enumerate(graphs.sessions)]
        graphs.enable_decode_graphs(BS, 2, 4, 4, 16)
        assert len(runs) == 2 * 2 * 2 * 3  # slots x buckets (1, 2 rows) x partitions x CAPTURE_RUNS
        assert {name for i, name in runs if i == 0} == {"wicore-part0_0"}
        assert {name for i, name in runs if i == 1} == {"wicore-part1_0"}
        runs.clear()
        graphs.run(build_batch([_row([5], 3, [1], 1)], BS))
        assert [name for _, name in runs] == ["wicore-part0_0", "wicore-part1_0"]
    finally:
        graphs.close()


class _Binding:
    def __init__(self, events: list[tuple[str, ...]]) -> None:
        self.events = events

    def bind_ortvalue_input(self, name: str, value: str) -> None:
        self.events.append(("input", name, value))

    def bind_ortvalue_output(self, name: str, value: str) -> None:
        self.events.append(("output", name, value))


def test_the_handoff_binds_its_source_again_before_each_copy():
    """ONNX Runtime copies an input bound on another device when it is bound (IOBinding::BindInput),
    not when the session runs: a handoff bound once handed cuda:1 the bind-time hidden states at
    every step (the wrong tokens of the split's first CUDA-graph runs). Each copy binds the source
    again, then runs."""
    from wicore.executor.card_handoff import card_handoff

    events: list[tuple[str, ...]] = []
    session = SimpleNamespace(io_binding=lambda: _Binding(events), run_with_iobinding=lambda b: events.append(("run",)))
    handoff = card_handoff(session, "written on cuda:0", "read on cuda:1")
    handoff()
    handoff()
    assert events == [
        ("output", "x_out", "read on cuda:1"),
        ("input", "x", "written on cuda:0"),
        ("run",),
        ("input", "x", "written on cuda:0"),
        ("run",),
    ]


def test_the_handoff_session_copies_one_bound_buffer_into_another():
    """handoff_graph, bound as DecodeGraphs binds it between two cards' hidden-state buffers."""
    session = ort.InferenceSession(handoff_graph(TensorProto.FLOAT, ("rows", 1, 3)).SerializeToString())
    src = ort.OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 1, 3))
    dst = ort.OrtValue.ortvalue_from_numpy(np.zeros((2, 1, 3), np.float32))
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", src)
    binding.bind_ortvalue_output("x_out", dst)
    session.run_with_iobinding(binding)
    assert dst.numpy().reshape(-1).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_cuda_graphs_over_several_cards_stay_off_unless_switched_on(monkeypatch):
    """WICORE_SPLIT_CUDA_GRAPHS picks how hidden states cross between cards; unset they are off, and a
    value that is not a way is refused by name."""
    from wicore.devices.providers import DeviceError
    from wicore.executor.graphs import SPLIT_GRAPHS_ENV, split_graphs

    monkeypatch.delenv(SPLIT_GRAPHS_ENV, raising=False)
    assert split_graphs() is None
    for value in ("device", "host", " HOST "):
        monkeypatch.setenv(SPLIT_GRAPHS_ENV, value)
        assert split_graphs() == value.strip().lower()
    monkeypatch.setenv(SPLIT_GRAPHS_ENV, "nvlink")
    with pytest.raises(DeviceError, match="WICORE_SPLIT_CUDA_GRAPHS=nvlink: choose one of device, host"):
        split_graphs()


def test_graphs_over_several_cards_are_asked_for_by_the_flag_or_the_environment(monkeypatch):
    """`--cuda-graphs on` over a split captures with the device handoff; auto (None) and off leave it
    uncaptured; the environment's way wins where set (and turns auto on); one card has no handoff."""
    from wicore.executor.graphs import SPLIT_GRAPHS_ENV, split_handoff

    monkeypatch.delenv(SPLIT_GRAPHS_ENV, raising=False)
    assert [split_handoff(flag, True) for flag in (True, None, False)] == ["device", None, None]
    assert split_handoff(True, False) is None
    monkeypatch.setenv(SPLIT_GRAPHS_ENV, "host")
    assert [split_handoff(flag, True) for flag in (True, None)] == ["host", "host"]


def test_hidden_states_cross_cards_through_the_host_where_graphs_replay_in_flight():
    """Between two cards partition 0 writes its hidden states on its own card for the next worker to
    read, except where CUDA graphs replay with steps in flight: there a replay on that card could run
    in the buffer's place before it is read, so the run writes them to the host."""
    cards = [SimpleNamespace(ort_device=("cuda", 0)), SimpleNamespace(ort_device=("cuda", 1))]
    for in_flight, want in ((False, ("cuda", 0)), (True, ("cpu", 0))):
        graphs = SimpleNamespace(devices=cards, replays_in_flight=in_flight)
        assert ModelGraphs._handoff_device(graphs, 0) == want  # type: ignore[arg-type]
    same = SimpleNamespace(devices=[cards[0], cards[0]], replays_in_flight=True)
    assert ModelGraphs._handoff_device(same, 0) == ("cuda", 0)  # type: ignore[arg-type]
