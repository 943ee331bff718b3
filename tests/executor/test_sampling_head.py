"""The sampling head (wicore/graph/sampling.py): a graph that draws sampled rows itself gives the
tokens the host sampler gives from the logits, for the same seeds."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.executor.sampler import Sampler, _inverse_cdf, candidates, temperature_weights
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.graph.sampling import TOP_CANDIDATES, head_model
from wicore.structured.bitmask import num_words
from wicore.types.sampling import SamplingParams


def head_session(vocab: int) -> ort.InferenceSession:
    return ort.InferenceSession(head_model(vocab).SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("vocab", [262_208, 1_000, 40])
def test_the_head_draws_the_host_samplers_token_and_candidates(vocab, tmp_path):
    rng = np.random.default_rng(vocab)
    rows = 32
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    logits[0, 7] = logits[0, 9] = logits[0].max() + 1  # a tie for the top: the lower id first, as on the host
    temperature = rng.uniform(0.2, 2.0, rows).astype(np.float32)
    uniform = rng.random(rows).astype(np.float32)
    free = np.full((rows, num_words(vocab)), -1, np.int32)  # no row has a grammar
    feeds = {
        io.LOGITS: logits,
        io.SAMPLING_TEMPERATURE: temperature,
        io.SAMPLING_UNIFORM: uniform,
        io.SAMPLING_TOKEN_BITMASK: free,
    }
    tokens, probs, ids = head_session(vocab).run([io.SAMPLED_TOKENS, io.TOP_PROBS, io.TOP_IDS], feeds)
    k = min(TOP_CANDIDATES, vocab)
    assert probs.shape == ids.shape == (rows, k)
    for r in range(rows):
        weights = temperature_weights(logits[r], float(temperature[r]))
        assert tokens[r] == _inverse_cdf(weights, float(uniform[r]))
        order = np.lexsort((np.arange(vocab), -weights))[:k]
        assert ids[r].tolist() == order.tolist()
        np.testing.assert_allclose(probs[r], weights[order] / weights.sum(dtype=np.float64), rtol=2e-4, atol=1e-9)
    assert ids[0, :2].tolist() == [7, 9]


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (40, 0.9), (64, 0.3), (0, 0.5), (0, 0.999)])
def test_a_top_k_top_p_draw_from_the_candidates_is_the_hosts(top_k, top_p):
    rng = np.random.default_rng(top_k)
    logits = (rng.standard_normal(5_000) * 3).astype(np.float32)
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p, seed=11)
    weights = temperature_weights(logits, params.temperature)
    order = np.lexsort((np.arange(len(weights)), -weights))[:TOP_CANDIDATES]
    probs = (weights[order] / weights.sum(dtype=np.float64)).astype(np.float32)
    host, head = Sampler(params), Sampler(params)
    kept = candidates(weights, top_k, top_p)
    assert kept is not None
    holds = top_k > 0 or len(kept[0]) <= TOP_CANDIDATES  # without top-k, the nucleus may outgrow K
    for _ in range(50):
        token = head.from_candidates(probs, order)
        if not holds:
            assert token is None  # the logits decide; no draw was spent
            return
        assert token == host.sample(logits).token_id


def test_tied_candidates_in_any_order_draw_what_the_host_draws():
    # An EP's TopK may give tied logits in any order (the CUDA EP's differs with the row count):
    # the draw must not turn on it. Every logit here ties with three others.
    logits = np.repeat(np.arange(40, dtype=np.float32) / 4, 4)
    params = SamplingParams(temperature=1.0, top_k=40, seed=3)
    weights = temperature_weights(logits, params.temperature)
    order = np.lexsort((np.arange(len(weights)), -weights))
    probs = (weights[order] / weights.sum(dtype=np.float64)).astype(np.float32)
    shuffled = np.concatenate([tied[::-1] for tied in np.split(order, len(order) // 4)])
    assert shuffled.tolist() != order.tolist() and np.array_equal(weights[shuffled], weights[order])
    host, head = Sampler(params), Sampler(params)
    drawn = [head.from_candidates(probs, shuffled) for _ in range(200)]
    assert drawn == [host.sample(logits).token_id for _ in range(200)]


@pytest.fixture(scope="module")
def exports(tiny_model, tmp_path_factory):
    """The same tiny random Gemma 3 exported without and with the sampling head (2 partitions)."""
    folder, _ = tiny_model()
    made = {}
    for head in ("off", "on"):
        out = tmp_path_factory.mktemp(f"sampling_head_{head}") / "model"
        export_model(open_source(str(folder)), out, ExportConfig(num_partitions=2, sampling_head=head), progress=lambda _: None)
        made[head] = out
    return made


def test_the_head_is_in_the_manifest_only_where_asked_and_in_no_partition(exports):
    off, on = (Manifest.read(exports[h]) for h in ("off", "on"))
    assert (off.sampling_head, off.has_sampling_head, on.sampling_head, on.has_sampling_head) == (False, False, True, True)
    assert [p.has_sampling_head for p in on.partitions] == [False, False]  # its own graph, built at load
    assert not {io.SAMPLING_TEMPERATURE, io.SAMPLING_UNIFORM} & set(on.partitions[-1].inputs)
    assert ExportConfig().has_sampling_head() is False
    assert ExportConfig(dtype="fp16", attention="paged").has_sampling_head() is True
    assert ExportConfig(dtype="fp16", attention="paged", sampling_head="off").has_sampling_head() is False


MIXED = [
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=1),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.3, seed=2),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, top_k=8, seed=3),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, top_k=40, top_p=0.9, seed=4),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, top_p=0.6, seed=5),  # nucleus past K: logits
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.3, top_p=0.2, seed=6),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, top_k=100, seed=7),  # top-k past K: logits
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, logprobs=2, seed=8),  # logprobs: logits
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, presence_penalty=1.0, seed=9),
    SamplingParams(max_tokens=12, ignore_eos=True),  # greedy
    # min-p, repetition penalty and logit bias are the host sampler's (the head draws without them)
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.3, min_p=0.6, seed=10),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, repetition_penalty=1.5, seed=11),
    SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, logit_bias=((7, 100.0),), seed=12),  # forced to 7
    SamplingParams(max_tokens=12, ignore_eos=True, logit_bias=((5, 100.0),)),  # greedy, forced to token 5
]


@pytest.mark.parametrize("batch", [MIXED, MIXED[:6]], ids=["every-path", "head-only"])
def test_an_engine_on_the_head_generates_what_the_host_sampler_generates(exports, batch):
    """Every row in one batch: with rows that need logits the head's rows read them too; without
    (head-only), the logits stay unread but for the nucleus that outgrows the candidates."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 512, int(n)).tolist() for n in rng.integers(4, 30, len(batch))]
    outputs = {}
    for head, folder in exports.items():
        config = EngineConfig(
            model_dir=folder,
            num_threads=1,
            block_size=4,
            num_device_blocks=256,
            num_host_blocks=0,
            num_nvme_blocks=0,
            scheduler=SchedulerConfig(max_num_batched_tokens=512, prefill_chunk=64),
        )
        with Engine(config) as eng:
            ids = [eng.add_request(p, params) for p, params in zip(prompts, batch)]  # one batch: every path at once
            eng.start()
            outputs[head] = [[t for out in eng.outputs(i) for t in out.new_token_ids] for i in ids]
    assert all(len(tokens) == 12 for tokens in outputs["on"])
    assert outputs["on"] == outputs["off"]
    if len(batch) == len(MIXED):
        assert outputs["on"][-2:] == [[7] * 12, [5] * 12]


def test_the_head_runs_only_in_steps_where_a_row_samples(exports):
    """A greedy step never pays the head's TopK over the vocabulary: the head's session runs once
    a step while a sampled request decodes, and not at all for greedy ones."""
    config = EngineConfig(model_dir=exports["on"], num_threads=1, block_size=4, num_device_blocks=64, num_host_blocks=0)
    with Engine(config) as eng:
        head = eng.core.runner.graphs.head
        assert head is not None
        greedy = eng.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=6, ignore_eos=True))
        assert [len(c.token_ids) for c in greedy] == [6, 6] and head.num_runs == 0
        eng.generate([[5, 6, 7]], SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.7, seed=1))
        assert head.num_runs == 6  # the prefill's step and five decode steps, one draw each
