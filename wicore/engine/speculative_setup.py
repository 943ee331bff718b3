"""The engine's speculator from its settings: n-gram lookup, or a draft model on an engine of its own.

The draft model runs on a second Engine (its own graphs, KV pools and step loop, on the devices
it is given) with the prefix cache on: each proposal is a greedy request for the sequence so
far, so the draft engine reuses the full blocks it computed for the previous proposal and runs
only the tokens since. A proposal that puts all its mass on its tokens keeps the target's
distribution under speculative sampling (Sampler.verify), so the draft decodes greedily.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from wicore.engine.config import EngineConfig
from wicore.engine.proposers import NgramProposer
from wicore.engine.speculative import Speculator
from wicore.errors import ManifestError, WiCoreError
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams


def build_speculator(config: EngineConfig, manifest: Manifest) -> Speculator:
    spec = config.speculative
    assert spec is not None
    if spec.method == "ngram":
        return Speculator(spec, NgramProposer(spec.ngram_max, spec.ngram_min))
    assert spec.draft_model_dir is not None
    draft_dir = Path(spec.draft_model_dir)
    check_same_vocabulary(Path(config.model_dir), manifest, draft_dir, Manifest.read(draft_dir))
    from wicore.engine.engine import Engine  # the draft model's engine: the same class, one level down

    draft_config = replace(
        config,
        model_dir=draft_dir,
        speculative=None,
        enable_prefix_cache=True,
        devices=spec.draft_devices or config.devices,
        cuda_graphs=False,
        profile_prefix=None,
    )
    return Speculator(spec, DraftModelProposer(Engine(draft_config)))


def check_same_vocabulary(target_dir: Path, target: Manifest, draft_dir: Path, draft: Manifest) -> None:
    """A draft model must share the target's tokenizer: the same vocabulary size and, where both
    folders have one, the same tokenizer.json."""
    sizes = (target.config.vocab_size, draft.config.vocab_size)
    if sizes[0] != sizes[1]:
        raise ManifestError(
            f"the draft model {draft_dir} has a vocabulary of {sizes[1]} tokens, the target {sizes[0]}: "
            "a draft model must use the target's tokenizer"
        )
    files = [d / "tokenizer.json" for d in (target_dir, draft_dir)]
    if all(f.is_file() for f in files) and len({hashlib.sha256(f.read_bytes()).digest() for f in files}) != 1:
        raise ManifestError(f"the draft model {draft_dir} has another tokenizer.json than the target {target_dir}")


class DraftModelProposer:
    """Greedy continuations from a draft model's engine (started here, stopped by `close`)."""

    def __init__(self, engine: object) -> None:
        from wicore.engine.engine import Engine

        assert isinstance(engine, Engine)
        self.engine = engine.start()

    def propose(self, sequences: dict[str, Sequence[int]], num_tokens: dict[str, int]) -> dict[str, list[int]]:
        limit = self.engine.max_sequence_tokens
        ids = [i for i in sequences if len(sequences[i]) + num_tokens[i] <= limit]
        if not ids:
            return {}
        params = [SamplingParams(max_tokens=num_tokens[i], ignore_eos=True, speculative=False) for i in ids]
        try:
            completions = self.engine.generate([list(sequences[i]) for i in ids], params)
        except WiCoreError:  # the draft engine cannot take them now (its queue, its KV cache): no drafts
            return {}
        return {i: c.token_ids for i, c in zip(ids, completions) if c.error is None and c.token_ids}

    def close(self) -> None:
        self.engine.stop()
