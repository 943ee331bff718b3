"""The speculative-decoding flags of `wicore serve` and `wicore generate` (wicore.engine.speculative)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wicore.engine.speculative import SpeculativeConfig


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative",
        choices=("ngram",),
        default=None,
        help="speculative decoding by prompt lookup: the continuation of the latest n-gram's earlier occurrence",
    )
    p.add_argument(
        "--draft-model", type=Path, default=None, help="speculative decoding with this exported draft model (same tokenizer)"
    )
    p.add_argument("--draft-devices", default=None, help="where the draft model runs (default: --devices)")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="draft tokens a step verifies at most (default 4)")
    p.add_argument(
        "--speculative-max-batch", type=int, default=None, help="no speculation while more requests decode (default 8)"
    )


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """The settings the flags give; None when speculation is off. Raises ValueError for a bad combination."""
    from wicore.engine.speculative import SpeculativeConfig

    method, draft = getattr(args, "speculative", None), getattr(args, "draft_model", None)
    if method is not None and draft is not None:
        raise ValueError("--speculative ngram and --draft-model are two proposers: give one of them")
    if method is None and draft is None:
        if getattr(args, "num_speculative_tokens", None) is not None or getattr(args, "draft_devices", None) is not None:
            raise ValueError("--num-speculative-tokens and --draft-devices need --speculative ngram or --draft-model")
        return None
    if draft is not None and not (Path(draft) / "wicore.json").is_file():
        raise ValueError(f"--draft-model {draft}: not an exported model folder (no wicore.json); export it with wicore-export")
    extra = {} if args.num_speculative_tokens is None else {"num_speculative_tokens": args.num_speculative_tokens}
    if args.speculative_max_batch is not None:
        extra["max_batch"] = args.speculative_max_batch
    return SpeculativeConfig(
        method="ngram" if draft is None else "draft", draft_model_dir=draft, draft_devices=args.draft_devices, **extra
    )
