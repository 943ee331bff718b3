"""`wicore`: run an exported model (`generate`; `serve`, `plan` and `bench` arrive with their issues)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wicore.errors import RequestError, WiCoreError


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="print the continuation of a prompt")
    p.add_argument("--model", default="gemma3-270m", help="exported model folder, or gemma3-270m (exported once, cached)")
    p.add_argument("--prompt", action="append", default=[], help="prompt text; repeat for a batch")
    p.add_argument("--prompt-file", action="append", default=[], type=Path, help="read a prompt from a file ('-': stdin)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn with the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--stats", action="store_true", help="print prefill and decode speed to stderr")
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from wicore.runtime.generator import Generator
    from wicore.runtime.models import resolve_model
    from wicore.runtime.providers import onnxruntime
    from wicore.runtime.sampler import SamplingParams

    texts = args.prompt + [sys.stdin.read() if str(f) == "-" else read_text(f) for f in args.prompt_file]
    if not texts:
        raise RequestError("give at least one --prompt or --prompt-file")
    onnxruntime()  # fail early, with the extras to install, before any export
    gen = Generator.load(resolve_model(args.model), num_threads=args.threads)
    tok = gen.tokenizer
    if args.chat:
        chats = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
        prompts = [tok.encode(c, add_bos=False) for c in chats]
    else:
        prompts = [tok.encode(t) for t in texts]
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    out = gen.generate(prompts, params)
    for i, ids in enumerate(out.token_ids):
        if len(prompts) > 1:
            print(f"--- [{i}] ({out.finish_reasons[i]})")
        print(tok.decode(ids))
    if args.stats:
        decoded = sum(len(t) for t in out.token_ids)
        print(
            f"prompt {out.num_prompt_tokens} tok in {out.prefill_seconds:.2f}s "
            f"({out.num_prompt_tokens / max(out.prefill_seconds, 1e-9):.1f} tok/s); "
            f"generated {decoded} tok, decode {out.num_decode_steps / max(out.decode_seconds, 1e-9):.1f} steps/s",
            file=sys.stderr,
        )
    return 0


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise RequestError(f"cannot read prompt file {path}: {exc.strerror}") from exc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="wicore", description="Portable LLM inference on ONNX Runtime.")
    sub = ap.add_subparsers(dest="command", required=True)
    add_generate(sub)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except WiCoreError as exc:
        print(f"wicore: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
