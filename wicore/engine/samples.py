"""A step's sampled tokens into a request: appended one by one until one ends it.

samples  s0 s1 s2 s3        (one, or a verified speculative run: its kept drafts and a bonus token)
append   s0 s1 s2           s2 is a stop token (or the grammar finished, or max_tokens / the context):
                            s3 is dropped, stop_reason is set
refused  s0 s1 x            the grammar refuses x: a mask bug; the scheduler fails the request
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wicore.engine.request import Request
from wicore.engine.scheduler_config import SchedulerConfig, SchedulerStats
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import Logprobs, Sample


@dataclass
class TakenSamples:
    """What `take_samples` appended: the new tokens, their logprobs, the prompt's logits (the first
    output carries them), why the request stops (None: it goes on) or the token its grammar refused."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Logprobs] = field(default_factory=list)
    prompt_logits: np.ndarray | None = None
    stop_reason: str | None = None
    refused_token: int | None = None

    def output(self, req: Request) -> RequestOutput:
        """What the request's client gets for them."""
        return RequestOutput(
            req.request_id,
            self.token_ids,
            self.stop_reason is not None,
            self.stop_reason,
            len(req.prompt_ids),
            req.num_cached_prompt_tokens,
            logprobs=self.logprobs or None,
            prompt_logits=self.prompt_logits,
        )


def take_samples(req: Request, samples: list[Sample], config: SchedulerConfig, stats: SchedulerStats) -> TakenSamples:
    """Append `samples` to the request's tokens up to the first that ends it or that its grammar refuses."""
    taken = TakenSamples()
    for sample in samples:
        if req.grammar is not None and not req.grammar.accept(sample.token_id):
            taken.refused_token = sample.token_id
            return taken
        req.token_ids.append(sample.token_id)
        taken.token_ids.append(sample.token_id)
        if sample.logprobs is not None:
            taken.logprobs.append(sample.logprobs)
        stats.num_generated_tokens += 1
        if req.prompt_logits and req.num_output_tokens == 1:  # the first output carries them
            taken.prompt_logits, req.prompt_logits = np.concatenate(req.prompt_logits), []
        taken.stop_reason = stop_reason(req, sample.token_id, config)
        if taken.stop_reason is not None:
            break
    return taken


def stop_reason(req: Request, token: int, config: SchedulerConfig) -> str | None:
    """Why the request ends at `token` ("stop", "length"), or None."""
    p = req.params
    if token in p.stop_token_ids or (not p.ignore_eos and token in config.eos_token_ids):
        return "stop"
    if req.grammar is not None and req.grammar.is_finished:  # the output is complete: nothing but EOS can follow
        return "stop"
    context = config.max_context
    if req.num_output_tokens >= req.max_tokens or (context is not None and req.num_tokens >= context):
        return "length"
    return None
