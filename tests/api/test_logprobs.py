"""Which tokens go out with which piece of text, and the two OpenAI shapes of logprobs."""

from __future__ import annotations

from wicore.api.logprobs import MIN_LOGPROB, LogprobFormatter, LogprobQueue, TokenLogprobs
from wicore.types.sampling import Logprobs

VOCAB = {0: "<eos>", 1: "▁Paris", 2: "<0xE2>", 3: "▁is", 4: "."}


class Vocabulary:
    """The Tokenizer method the formatter uses, over a five-token vocabulary (SentencePiece's byte fallback)."""

    def token_bytes(self, token_id: int) -> bytes:
        piece = VOCAB[token_id]
        return bytes([int(piece[3:5], 16)]) if piece.startswith("<0x") else piece.replace("▁", " ").encode()


def lp(token_id: int, logprob: float, *top: tuple[int, float]) -> Logprobs:
    return Logprobs(token_id, logprob, tuple(i for i, _ in top), tuple(v for _, v in top))


def test_queue_releases_tokens_whose_text_begins_in_what_was_sent():
    queue = LogprobQueue()
    for offset, token_id in [(0, 1), (6, 3), (9, 2), (9, 4)]:  # token 2 has no text of its own yet
        queue.add(offset, lp(token_id, -1.0))
    assert [t.offset for t in queue.take(6)] == [0]
    assert [t.offset for t in queue.take(9)] == [6]  # the tokens at 9 wait for a character at 9
    assert [t.logprobs.token_id for t in queue.take(10)] == [2, 4]
    queue.add(10, lp(0, -0.5))
    assert queue.take(10) == [] and [t.offset for t in queue.take_all()] == [10]


def test_chat_shape_with_bytes_of_a_byte_fallback_token():
    fmt = LogprobFormatter(Vocabulary())  # type: ignore[arg-type]
    shaped = fmt.chat([TokenLogprobs(0, lp(1, -0.25, (1, -0.25), (2, float("-inf"))))])
    assert shaped == {
        "refusal": None,
        "content": [
            {
                "token": " Paris",
                "logprob": -0.25,
                "bytes": [32, 80, 97, 114, 105, 115],
                "top_logprobs": [
                    {"token": " Paris", "logprob": -0.25, "bytes": [32, 80, 97, 114, 105, 115]},
                    {"token": "\ufffd", "logprob": MIN_LOGPROB, "bytes": [0xE2]},
                ],
            }
        ],
    }


def test_completion_shape_always_holds_the_chosen_token():
    fmt = LogprobFormatter(Vocabulary())  # type: ignore[arg-type]
    shaped = fmt.completion(
        [
            TokenLogprobs(0, lp(1, -0.5, (1, -0.5))),
            TokenLogprobs(6, lp(4, -3.0, (3, -0.1))),  # sampled, not among the top 1
            TokenLogprobs(7, lp(0, -1.0)),
        ]
    )
    assert shaped == {
        "tokens": [" Paris", ".", "<eos>"],
        "token_logprobs": [-0.5, -3.0, -1.0],
        "top_logprobs": [{" Paris": -0.5}, {" is": -0.1, ".": -3.0}, {"<eos>": -1.0}],
        "text_offset": [0, 6, 7],
    }
