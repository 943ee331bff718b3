"""Queueing a request's choices in the engine: all of them or none, with the checks that need the
model (image placeholders, logit_bias ids against the vocabulary) and the engine's admission
errors turned into the 400 / 503 they stand for."""

from __future__ import annotations

from wicore.api.errors import APIError, from_wicore
from wicore.api.images import check_placeholders
from wicore.api.schemas import Options
from wicore.api.serving import ServingEngine
from wicore.errors import WiCoreError
from wicore.types.images import ImageInput
from wicore.types.sampling import SamplingParams


def queue_choices(
    engine: ServingEngine, rid: str, prompts: list[list[int]], opts: Options, param: str, images: list[ImageInput]
) -> list[str]:
    """Queue every choice of every prompt (n per prompt) in the engine, or none: the engine's
    admission errors become the 400 / 503 they stand for, naming `param` for the prompt.
    `images` go with every prompt (the engine encodes each distinct image once)."""
    if engine.vision is not None:
        check_placeholders(prompts, len(images), engine.vision.config.boi_token_id, param)
    check_logit_bias(engine, opts)
    num_choices = len(prompts) * opts.n
    if num_choices > engine.max_waiting:  # never fits: a 400, not a 503 to retry
        raise APIError(
            400,
            f"this request has {num_choices} choices ({len(prompts)} prompts x n={opts.n}); the server "
            f"queues at most {engine.max_waiting}: send fewer prompts or a smaller n",
            param="n" if opts.n > 1 else param,
            code="too_many_choices",
        )
    request_ids: list[str] = []
    try:
        for ids in prompts:
            for j in range(opts.n):
                seed = None if opts.seed is None else (opts.seed + j) % (1 << 64)
                params = SamplingParams(
                    max_tokens=opts.max_tokens,
                    temperature=opts.temperature,
                    top_k=opts.top_k,
                    top_p=opts.top_p,
                    seed=seed,
                    presence_penalty=opts.presence_penalty,
                    frequency_penalty=opts.frequency_penalty,
                    logprobs=opts.logprobs,
                    speculative=opts.speculative,
                    ignore_eos=opts.ignore_eos,
                    logit_bias=opts.logit_bias,
                    min_p=opts.min_p,
                    repetition_penalty=opts.repetition_penalty,
                    structured=opts.structured,
                )
                request_ids.append(
                    engine.add_request(ids, params, opts.priority, request_id=f"{rid}-{len(request_ids)}", images=images)
                )
    except WiCoreError as exc:
        for request_id in request_ids:
            engine.cancel(request_id)
        raise from_wicore(exc, param) from exc
    return request_ids


def check_logit_bias(engine: ServingEngine, opts: Options) -> None:
    """A 400 for a logit_bias token id past the vocabulary (OpenAI's and vLLM's check)."""
    if not opts.logit_bias:
        return
    try:
        vocab_size = engine.tokenizer.vocab_size
    except WiCoreError:  # a model exported without a tokenizer: the sampler skips ids past its logits
        return
    outside = [token_id for token_id, _ in opts.logit_bias if token_id >= vocab_size]
    if outside:
        raise APIError(
            400,
            f"logit_bias: token id {outside[0]} is out of the vocabulary (ids 0 to {vocab_size - 1})",
            param="logit_bias",
            code="invalid_value",
        )
