"""`wicore generate`: prompts from the command line through the engine `serve` uses."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from wicore.cli.constraint_args import add_constraint_args, constraint_from_args
from wicore.cli.engine_args import add_engine_args, engine_config, read_text
from wicore.errors import ImageTokenError, RequestError, UsageError
from wicore.types.images import image_token_texts

if TYPE_CHECKING:
    from wicore.engine.engine import Engine
    from wicore.types.outputs import RequestOutput


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="print the continuation of a prompt")
    p.add_argument(
        "--model",
        default="gemma3-270m",
        help="exported model folder, a .gguf file or a Hugging Face folder, or gemma3-270m / smollm2-135m-instruct "
        "(these exported once into the cache) (default: %(default)s)",
    )
    p.add_argument("--prompt", action="append", default=[], help="prompt text; repeat for a batch")
    p.add_argument("--prompt-file", action="append", default=[], type=Path, help="read a prompt from a file ('-': stdin)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn with the chat template")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy (default: %(default)s)")
    p.add_argument(
        "--top-k", type=int, default=0, help="draw from the k most likely tokens only; 0 keeps all (default: %(default)s)"
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="draw from the fewest most likely tokens whose probability reaches p; 1 keeps all (default: %(default)s)",
    )
    p.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="drop tokens less likely than min-p x the most likely one; 0 keeps all (default: %(default)s)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divide positive logits (multiply negative ones) of tokens already in the prompt or output; 1 is off "
        "(default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the draws, for repeatable sampling (default: random)")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        type=Path,
        help="an image (PNG, JPEG, WebP, GIF) before each prompt's text; repeat",
    )
    p.add_argument("--stats", action="store_true", help="print prefill and decode speed to stderr")
    add_constraint_args(p)
    add_engine_args(p)
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    """The prompts run together on the engine that `serve` uses (continuous batching, the KV
    tiers, sliding-window release), each printed when all are done."""
    from wicore.cli.models import cached_export_errors, resolve_model
    from wicore.devices.providers import onnxruntime
    from wicore.engine.engine import Engine
    from wicore.types.sampling import SamplingParams

    texts = args.prompt + [sys.stdin.read() if str(f) == "-" else read_text(f) for f in args.prompt_file]
    if not texts:
        raise UsageError("give at least one --prompt or --prompt-file")
    onnxruntime()  # fail early, with the extras to install, before any export
    args.max_num_seqs = min(args.max_num_seqs, len(texts))  # the sliding layers' pool is sized for these
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        structured=constraint_from_args(args),
    )
    model_dir = resolve_model(args.model, args.devices)
    with cached_export_errors(args.model, model_dir):
        engine = Engine(engine_config(args, model_dir))
    with engine:
        tok = engine.tokenizer
        images = [load_image_file(engine, path) for path in args.image]
        if args.chat:
            images_first = [{"type": "image"}] * len(images)
            turns = [[*images_first, {"type": "text", "text": t}] if images else t for t in texts]
            texts = [tok.apply_chat_template([{"role": "user", "content": turn}]) for turn in turns]
        elif images:  # as /v1/inference: the images in front of the text
            assert engine.vision is not None  # load_image_file took the images: the model has a vision tower
            try:
                boi = image_token_texts(tok.id_to_token, engine.vision.config)[0]
            except ImageTokenError as exc:
                raise UsageError(f"--image: {exc}") from exc
            texts = [boi * len(images) + t for t in texts]
        texts = [engine.expand_images(t) for t in texts] if images else texts
        prompts = [tok.encode(t, add_bos=False if args.chat else None) for t in texts]
        request_ids = [engine.add_request(p, params, images=images) for p in prompts]
        start = time.perf_counter()
        engine.start()
        results = asyncio.run(collect(engine, request_ids))
    failed = 0
    for i, (tokens, _, end) in enumerate(results):
        if len(prompts) > 1:
            print(f"--- [{i}] ({end.finish_reason})")
        print(tok.decode(tokens))
        if end.finish_reason == "error":
            print(f"error: {end.error}", file=sys.stderr)
            failed += 1
    if args.stats:
        print_generate_stats(sum(map(len, prompts)), results, start)
    return 1 if failed else 0


def load_image_file(engine, path: Path):  # -> ImageInput
    from wicore.executor.vision import NO_VISION
    from wicore.inputs.image_loader import load_image

    if engine.vision is None:
        raise UsageError(f"--image {path}: {NO_VISION}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--image {path}: {exc.strerror}") from exc
    try:
        return load_image(data, engine.vision.config.preprocessing)
    except RequestError as exc:
        raise UsageError(f"--image {path}: {exc}") from exc


async def collect(engine: Engine, request_ids: list[str]) -> list[tuple[list[int], list[float], RequestOutput]]:
    """(token ids, the time each arrived, the final output) of every request, streamed concurrently."""

    async def one(request_id: str) -> tuple[list[int], list[float], RequestOutput]:
        tokens: list[int] = []
        times: list[float] = []
        end: RequestOutput | None = None
        async for out in engine.stream(request_id):
            tokens += out.new_token_ids
            times += [time.perf_counter()] * len(out.new_token_ids)
            end = out
        assert end is not None  # a request's stream ends with its finished output
        return tokens, times, end

    return list(await asyncio.gather(*(one(r) for r in request_ids)))


def print_generate_stats(num_prompt_tokens: int, results: list, start: float) -> None:
    """Prefill: until the last request's first token; decode: every later token, over the span
    from the first first token to the last token."""
    firsts = [times[0] for _, times, _ in results if times]
    lasts = [times[-1] for _, times, _ in results if times]
    if not firsts:
        print(f"prompt {num_prompt_tokens} tok; no token generated", file=sys.stderr)
        return
    prefill = max(firsts) - start
    decoded = sum(max(len(times) - 1, 0) for _, times, _ in results)
    span = max(lasts) - min(firsts)
    print(
        f"prompt {num_prompt_tokens} tok in {prefill:.2f}s ({num_prompt_tokens / max(prefill, 1e-9):.1f} tok/s); "
        f"generated {decoded + len(firsts)} tok, decode {decoded / max(span, 1e-9):.1f} tok/s "
        f"({len(results)} stream{'s' if len(results) > 1 else ''})",
        file=sys.stderr,
    )
