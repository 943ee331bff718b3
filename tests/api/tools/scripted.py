"""An engine whose model says what the test scripts, behind the real app and tokenizer.

The app, the chat template, the tokenizer, the tool-call formats and the HTTP shapes are the
real ones; only the model is replaced (as tests/api/test_app_270m.py's FailingEngine replaces
its failures), so the text a tool call is read from is exact. The tokenizer is byte-level BPE
without merges (one token a byte: the stream splits every call as finely as it can) with
ChatML's special tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import Logprobs, SamplingParams

# SmolLM2-135M-Instruct's chat template (ChatML; it takes no tools)
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# gpt-oss's special tokens (o200k_harmony), and its chat template as openai/gpt-oss-120b ships it
HARMONY_SPECIALS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
GPT_OSS_TEMPLATE = (Path(__file__).parent / "gpt_oss_chat_template.jinja").read_text()


def harmony_tokenizer(folder: Path) -> Tokenizer:
    """The byte tokenizer with gpt-oss's special tokens and chat template; its turn ends at <|return|> or <|call|>."""
    return byte_tokenizer(folder, GPT_OSS_TEMPLATE, HARMONY_SPECIALS, ("<|return|>", "<|call|>"))


def byte_tokenizer(
    folder: Path,
    chat_template: str = CHATML,
    specials: tuple[str, ...] = ("<|im_start|>", "<|im_end|>"),
    eos: tuple[str, ...] = ("<|im_end|>",),
) -> Tokenizer:
    from tokenizers import Tokenizer as Fast
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    fast = Fast(models.BPE(vocab=vocab, merges=[]))
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    fast.decoder = decoders.ByteLevel()
    fast.add_special_tokens(list(specials))
    folder.mkdir(parents=True, exist_ok=True)
    fast.save(str(folder / "tokenizer.json"))
    info = TokenizerInfo(("tokenizer.json",), None, tuple(fast.token_to_id(t) for t in eos), None, False, chat_template)
    return Tokenizer(folder, info)


class ScriptedEngine:
    """The ServingEngine interface; every request's output is `answer` (cut at max_tokens), then
    the end-of-turn token, `tokens_per_output` tokens an output (more than one: a stream that fell
    behind, whose steps wicore.engine.channel merges). `requests` keeps each request's prompt ids
    and sampling params."""

    vision = None
    grammars = None  # scripted answers follow no constraint
    max_sequence_tokens = 4096
    max_waiting = 64

    def __init__(self, tokenizer: Tokenizer, answer: str = "", tokens_per_output: int = 1) -> None:
        self.tokenizer = tokenizer
        self.answer = answer
        self.tokens_per_output = tokens_per_output
        self.requests: dict[str, tuple[list[int], SamplingParams]] = {}

    def expand_images(self, text: str) -> str:
        return text

    def add_request(
        self,
        prompt: Any,
        params: SamplingParams,
        priority: Any = "normal",
        deadline: Any = None,
        request_id: str | None = None,
        images: Any = (),
    ) -> str:
        assert request_id is not None
        self.requests[request_id] = (list(prompt), params)
        return request_id

    def abort(self, request_id: str) -> None:
        pass

    def cancel(self, request_id: str) -> None:
        pass

    async def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        params = self.requests[request_id][1]
        ids = [*self.tokenizer.encode(self.answer, add_bos=False), *self.tokenizer.info.eos_token_ids]
        limit = params.max_tokens or len(ids)
        end = "stop" if limit >= len(ids) else "length"
        ids, n = ids[:limit], self.tokens_per_output
        for i in range(0, len(ids), n):
            last = i + n >= len(ids)
            reason = end if last else None
            logprobs = [Logprobs(t, -0.5) for t in ids[i : i + n]] if params.logprobs is not None else None
            yield RequestOutput(request_id, ids[i : i + n], finished=last, finish_reason=reason, logprobs=logprobs)

    def stats(self) -> dict[str, object]:
        return {}

    def prompt_text(self, request_id: str | None = None) -> str:
        """The prompt of a request (the last one by default) as text, special tokens written."""
        ids = self.requests[request_id or list(self.requests)[-1]][0]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@contextmanager
def serving(tokenizer: Tokenizer, answer: str = "", tokens_per_output: int = 1) -> Iterator[tuple[ScriptedEngine, str]]:
    """A ScriptedEngine on `tokenizer` behind the real app on a free port: (engine, URL)."""
    from wicore.api.app import ServerSettings, create_app
    from wicore.api.server import ServerThread

    engine = ScriptedEngine(tokenizer, answer, tokens_per_output)
    server = ServerThread(create_app(engine, ServerSettings(model_name="m"))).start()  # type: ignore[arg-type]
    try:
        yield engine, server.url
    finally:
        server.stop()
