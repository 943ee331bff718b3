"""What a scheduled row holds: the tokens a step runs for one request, with its blocks.

The scheduler decides which requests run and how many tokens; these functions turn that decision
into the row the runner reads (wicore.types.step.ScheduledRow), and cut a speculative draft to
what the row may verify.
"""

from __future__ import annotations

from collections.abc import Sequence

from wicore.blocks.block_groups import BlockGroups
from wicore.engine.request import Request
from wicore.engine.scheduler_config import SchedulerConfig
from wicore.types.step import ScheduledRow

FED_PLACEHOLDER = 0  # a fed row's token until the worker writes the one the step in flight sampled


def build_row(kv: BlockGroups, req: Request, n: int, draft: tuple[int, ...] = (), ahead: bool = False) -> ScheduledRow:
    """The row that runs `n` tokens of `req` from num_computed (and `draft`); `ahead`: the decode
    row after its last known token, its input fed from the step in flight (`ScheduledRow.fed`: a
    placeholder token here)."""
    start = req.num_tokens if ahead else req.num_computed
    window_table, window_first = kv.window_table(req.seq_id)
    needs_sample = ahead or start + n == req.num_tokens
    offloaded = kv.is_offloaded(req.seq_id)
    return ScheduledRow(
        request_id=req.request_id,
        token_ids=[FED_PLACEHOLDER] if ahead else req.token_ids[start : start + n] + list(draft),
        start=start,
        block_table=[] if offloaded else kv.block_table(req.seq_id),
        full_locations=tuple(kv.block_locations(req.seq_id)) if offloaded else (),
        block_ids=kv.block_ids(req.seq_id),
        window_table=window_table,
        window_first=window_first,
        num_logits=(n if req.wants_prompt_logits else int(needs_sample)) + len(draft),
        needs_sample=needs_sample,
        params=req.params,
        images=req.images_in(start, start + n),
        draft_ids=draft,
        prompt_ids=req.prompt_ids if req.params.repetition_penalty != 1.0 else (),
        grammar=req.grammar,
        fed=ahead,
    )


def is_decode(row: ScheduledRow) -> bool:
    """Whether `row` is a plain decode row: one token, its logit sampled, no draft, image or offloaded
    block. The next decode row of its request, built where the request's blocks have not changed since
    `row` was built, is `row` one position on (its tables, parameters and logit rows as they are)."""
    return (
        len(row.token_ids) == 1
        and row.num_logits == 1
        and row.needs_sample
        and not row.draft_ids
        and not row.images
        and not row.full_locations
    )


def clip_draft(config: SchedulerConfig, req: Request, n: int, draft: Sequence[int], tokens_left: int) -> tuple[int, ...]:
    """The part of a proposed draft that a decode row of `req` runs: within the step's tokens left
    and one prefill chunk (what the sliding layers' cache was sized for at admission)."""
    if n != 1 or req.num_tokens - req.num_computed != 1:
        return ()
    draft = draft[: max(0, min(tokens_left - 1, config.prefill_chunk - 1))]
    if config.long_rope_switch and not req.whole_until:  # short-factor keys: the row stays before the switch
        draft = draft[: max(0, config.long_rope_switch - req.num_tokens)]
    if req.grammar is not None:  # cut at the first draft token the grammar refuses: it could never be kept
        draft = draft[: req.grammar.num_valid(draft)]
    return tuple(draft)
