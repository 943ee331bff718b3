"""Output channels: a step's outputs reach every consumer in order, and an event loop is woken
once a step however many of its streams got a token (wicore.engine.channel.put_all)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from wicore.engine.channel import Channel, put_all
from wicore.types.outputs import RequestOutput, merge_outputs
from wicore.types.sampling import Logprobs


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the wakeups other threads ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.num_wakeups = 0

    def call_soon_threadsafe(self, callback, *args, context=None):  # type: ignore[override]
        self.num_wakeups += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def out(request_id: str, token: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id, [token], finished, "length" if finished else None)


def test_a_step_for_many_streams_wakes_their_loop_once():
    channels = {f"r{i}": Channel() for i in range(5)}
    loop = CountingLoop()
    received: dict[str, list[int]] = {name: [] for name in channels}

    async def consume(name: str) -> None:
        async for output in channels[name]:
            received[name] += output.new_token_ids

    async def main() -> int:
        tasks = [asyncio.create_task(consume(name)) for name in channels]
        await asyncio.sleep(0)  # every consumer attached and waiting
        steps = [[(c, out(name, 10 * step + int(name[1:]), step == 2)) for name, c in channels.items()] for step in range(3)]
        for step in steps:  # the engine thread's three steps, each waiting for the loop to drain
            sender = threading.Thread(target=put_all, args=(step,))
            sender.start()
            sender.join()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return loop.num_wakeups

    try:
        assert loop.run_until_complete(main()) == 3  # one a step, not one a stream a step (15)
    finally:
        loop.close()
    assert received == {f"r{i}": [i, 10 + i, 20 + i] for i in range(5)}


def test_outputs_put_before_the_consumer_attaches_are_kept_and_a_blocking_reader_gets_them():
    early, blocking = Channel(), Channel()
    put_all([(early, out("a", 1)), (blocking, out("b", 7))])
    put_all([(early, out("a", 2, finished=True))])

    async def read() -> list[list[int]]:
        return [o.new_token_ids async for o in early]

    assert asyncio.run(read()) == [[1, 2]] and early.is_finished  # both were ready: one merged output
    reader_got: list[list[int]] = []
    reader = threading.Thread(target=lambda: reader_got.extend(o.new_token_ids for o in blocking))
    reader.start()
    put_all([(blocking, out("b", 8, finished=True))])
    reader.join(timeout=5)
    assert reader_got == [[7], [8]]


def test_a_consumer_whose_loop_closed_does_not_stop_the_others():
    gone, alive = Channel(), Channel()
    closed = asyncio.new_event_loop()

    async def attach() -> None:
        iterator = gone.__aiter__()
        task = asyncio.ensure_future(iterator.__anext__())
        await asyncio.sleep(0)  # waiting on its event
        task.cancel()

    closed.run_until_complete(attach())
    closed.close()
    put_all([(gone, out("g", 1)), (alive, out("a", 2, finished=True))])  # no RuntimeError from the closed loop
    assert [o.new_token_ids for o in alive] == [[2]]


def test_take_ready_empties_the_channel_without_waiting_and_merged_outputs_keep_every_token():
    channel = Channel()
    assert channel.take_ready() == []
    first = RequestOutput("r", [5], False, None, 7, 3, logprobs=[Logprobs(5, -0.5)], prompt_logits=np.ones((7, 2)))
    put_all(
        [
            (channel, first),
            (channel, RequestOutput("r", [6, 8], False, None, 7, 3, logprobs=[Logprobs(6, -1.0), Logprobs(8, -2.0)])),
        ]
    )
    put_all([(channel, RequestOutput("r", [9], True, "stop", 7, 3, logprobs=[Logprobs(9, -3.0)]))])
    ready = channel.take_ready()
    assert [o.new_token_ids for o in ready] == [[5], [6, 8], [9]]
    assert channel.take_ready() == []
    merged = merge_outputs(ready)
    assert merged.request_id == "r"
    assert merged.new_token_ids == [5, 6, 8, 9]
    assert (merged.finished, merged.finish_reason, merged.num_prompt_tokens, merged.num_cached_tokens) == (True, "stop", 7, 3)
    assert [lp.logprob for lp in merged.logprobs or []] == [-0.5, -1.0, -2.0, -3.0]
    assert merged.prompt_logits is first.prompt_logits
    assert merge_outputs([first]) is first
    no_logprobs = merge_outputs([out("q", 1), out("q", 2, finished=True)])
    assert (no_logprobs.new_token_ids, no_logprobs.logprobs, no_logprobs.finish_reason) == ([1, 2], None, "length")


def test_an_asyncio_consumer_that_fell_behind_reads_the_steps_it_missed_as_one_output():
    """vLLM's RequestOutputCollector: k steps behind costs one wakeup (and one SSE event), not k;
    a consumer that keeps up still gets one output a step."""
    channel = Channel()

    async def main() -> list[RequestOutput]:
        reader = channel.__aiter__()
        got = [await asyncio.wait_for(anext_task(reader, lambda: put_all([(channel, out("r", 1))])), 5)]
        for step in (2, 3, 4):  # three steps while the consumer was busy elsewhere
            put_all([(channel, RequestOutput("r", [step], False, None, 9, 4, logprobs=[Logprobs(step, -step)]))])
        await asyncio.sleep(0.01)
        got.append(await reader.__anext__())
        put_all([(channel, out("r", 5, finished=True))])
        got.append(await reader.__anext__())
        return got

    async def anext_task(reader, put):  # the consumer waits first, then the step comes
        task = asyncio.ensure_future(reader.__anext__())
        await asyncio.sleep(0)
        threading.Thread(target=put).start()
        return await task

    got = asyncio.run(main())
    assert [o.new_token_ids for o in got] == [[1], [2, 3, 4], [5]]
    assert [lp.logprob for lp in got[1].logprobs or []] == [-2.0, -3.0, -4.0]
    assert (got[1].finished, got[1].num_prompt_tokens, got[1].num_cached_tokens) == (False, 9, 4)
    assert (got[2].finished, got[2].finish_reason, got[2].logprobs) == (True, "length", None)
