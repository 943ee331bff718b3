"""RequestOutput: a frozen dataclass with an __init__ of its own (its fields set at once); that __init__
must take exactly the fields, in order, with their defaults, and keep the dataclass's behaviour."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from wicore.types.outputs import RequestOutput


def test_the_init_takes_the_fields_in_order_with_their_defaults():
    fields = [(f.name, f.default) for f in dataclasses.fields(RequestOutput)]
    params = [(p.name, p.default) for p in list(inspect.signature(RequestOutput).parameters.values())]
    missing = dataclasses.MISSING
    assert params == [(name, inspect.Parameter.empty if default is missing else default) for name, default in fields]


def test_it_stays_a_frozen_dataclass():
    out = RequestOutput("r", [5, 6], False, num_prompt_tokens=3)
    assert vars(out) == {
        "request_id": "r",
        "new_token_ids": [5, 6],
        "finished": False,
        "finish_reason": None,
        "num_prompt_tokens": 3,
        "num_cached_tokens": 0,
        "error": None,
        "logprobs": None,
        "prompt_logits": None,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.finished = True  # type: ignore[misc]
    ended = dataclasses.replace(out, finished=True, error="boom")
    assert (ended.finished, ended.error, ended.new_token_ids) == (True, "boom", [5, 6])
    assert ended == RequestOutput("r", [5, 6], True, None, 3, 0, "boom")
    assert pickle.loads(pickle.dumps(ended)) == ended
    assert repr(out).startswith("RequestOutput(request_id='r', new_token_ids=[5, 6], finished=False")
