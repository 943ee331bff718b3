"""The prompts the benchmarks send, as token ids: the same for every engine of one run.

build_prompt_ids   bench_generate: one prompt, BOS then PARAGRAPH repeated (HF tokenizer of the GGUF)
build_prompts      bench_serving: one prompt per request, a distinct header, then SENTENCES shuffled
build_workload     bench_prefix_cache: users chatting in Gemma's chat format under a shared system prompt
unbounded_cache    the hit rate of a cache that never evicts on a chat workload: any policy's ceiling
INPUT_GROUNDED, ORDINARY   bench_speculative: texts to edit / rewrite / summarize, and open-ended
                   prompts (text; from workloads_speculative)
SERVING_SCHEMA     bench_structured, bench_structured_gpu: a JSON schema no reply completes before max_tokens
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from workloads_speculative import INPUT_GROUNDED, ORDINARY  # noqa: F401  (bench_speculative's prompt sets)

T = TypeVar("T")

PARAGRAPH = (
    "The river ran slowly past the old mill, carrying leaves from the hills "
    "down toward the sea. In the mornings the fishermen pushed their boats "
    "into the current and waited for the mist to lift, talking quietly about "
    "the weather, the price of bread, and the children who had moved away to "
    "the city. Nobody remembered who had built the mill, but everyone agreed "
    "that it had always been there, and that it would still be standing long "
    "after the last of them had gone."
)

SENTENCES = (
    "The river ran slowly past the old mill, carrying leaves from the hills down toward the sea.",
    "A compiler turns source text into a tree, the tree into instructions, and the instructions into a program.",
    "In spring the orchard fills with bees, and the farmer counts the blossoms to guess the harvest.",
    "The committee met on Tuesday to discuss the budget, but the vote was postponed until next month.",
    "Photosynthesis converts light, water and carbon dioxide into sugar and oxygen inside the leaf.",
    "She packed a map, two candles, a tin of biscuits and a notebook before setting out at dawn.",
    "The striker curled the ball past the keeper in the ninetieth minute, and the stadium erupted.",
    "Interest rates rose for the third quarter in a row, and mortgage applications fell sharply.",
    "Granite forms when magma cools slowly deep underground, giving its crystals time to grow large.",
    "The museum's new wing displays pottery, coins and tools recovered from a Roman harbour.",
    "To reset the router, hold the button on the back for ten seconds until the light blinks amber.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second.",
    "The recipe calls for flour, butter, a pinch of salt and enough cold water to bind the dough.",
    "A train left the station at noon, travelling east at eighty kilometres an hour through the valley.",
    "Her grandfather kept bees, repaired clocks and wrote long letters that nobody ever answered.",
    "The telescope's mirror must be polished to within a few millionths of a millimetre.",
    "After the storm the villagers gathered on the beach to drag the fishing boats above the tide line.",
    "Good documentation explains why a design was chosen, not only how the code should be called.",
    "The violinist tuned her strings twice, nodded to the pianist, and began the slow movement.",
    "Glaciers carve U-shaped valleys as they grind their way down from the mountains over centuries.",
    "The bakery on the corner opens at six, and by seven the queue stretches past the bus stop.",
    "Vaccines train the immune system to recognise a pathogen before it can cause serious disease.",
    "The lighthouse keeper logged every passing ship, the wind direction and the height of the waves.",
    "Chess players spend years studying openings, yet most games are decided by a single blunder.",
)

SYSTEM_PROMPT = (
    "You are Atlas, the support assistant of Northwind Outfitters, a company that sells hiking, camping "
    "and climbing equipment online and in twelve stores. Answer in a friendly, concise and accurate way. "
    "Follow these rules in every conversation. First, never invent order numbers, prices, delivery dates "
    "or stock levels: when you do not know them, say so and explain how the customer can find out. "
    "Second, for safety questions about climbing ropes, harnesses, helmets, stoves or avalanche gear, "
    "give general guidance only and always recommend the manufacturer's instructions and a certified "
    "instructor. Third, returns are accepted within sixty days with a receipt; worn footwear can be "
    "returned within thirty days if it shows no damage beyond normal indoor testing. Fourth, members of "
    "the Trail Club get free shipping, a ten percent discount on full-price items and early access to "
    "seasonal sales; membership is free and can be cancelled at any time. Fifth, repairs of tents, "
    "sleeping bags and jackets are done in the Portland workshop and usually take two to three weeks. "
    "Sixth, if a customer is upset, acknowledge the problem, apologise once, and focus on what can be "
    "done next. Seventh, keep personal data private: never repeat a full address, phone number or card "
    "number back to the customer. Eighth, when recommending products, ask about the trip first: the "
    "season, the terrain, the number of people, the expected weather and the budget. Ninth, answer in "
    "the customer's language when you can, and keep answers under two hundred words unless the "
    "customer asks for detail. Tenth, end every answer by asking whether there is anything else you "
    "can help with today."
)

TOPICS = (
    ("a tent for a family of four", "We camp by lakes in summer and sometimes get heavy rain."),
    ("returning hiking boots", "I wore them twice on short walks and they hurt my heels."),
    ("choosing a sleeping bag", "I am going to the Alps in October and sleep cold."),
    ("a delayed order", "I ordered a stove and two gas canisters nine days ago."),
    ("a first climbing harness", "I just started at an indoor gym and want my own gear."),
    ("repairing a torn jacket", "The zip came off and there is a small tear near the pocket."),
    ("Trail Club membership", "My partner and I both shop with you a few times a year."),
    ("winter gear for a beginner", "I want to try snowshoeing in January for the first time."),
    ("a backpack for long trips", "I plan a two-week hike with food drops every four days."),
    ("a water filter", "We will drink from streams in a national park next month."),
)

FOLLOW_UPS = (
    "Thanks. Could you explain that in a bit more detail?",
    "What would you recommend if my budget were smaller?",
    "Is there anything I should watch out for?",
    "How long would that take, roughly?",
    "Could you compare the two options you mentioned?",
    "And what if the weather turns bad halfway through?",
    "Does the Trail Club discount apply to this as well?",
    "Can I pick it up in a store instead of waiting for delivery?",
    "What do other customers usually choose in my situation?",
    "Could you summarise what I should do next, step by step?",
)


def fill_to(ids: list[int], more: Callable[[], list[int]], num_tokens: int) -> list[int]:
    """`ids` extended with `more()` until it has `num_tokens` ids, then cut to exactly that many."""
    while len(ids) < num_tokens:
        ids = ids + more()
    return ids[:num_tokens]


def build_prompt_ids(gguf: Path, num_tokens: int) -> tuple[list[int], Callable[[Sequence[int]], str]]:
    """Exactly `num_tokens` ids: BOS, then PARAGRAPH's ids repeated and truncated. Also returns a detokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    paragraph_ids = tokenizer(PARAGRAPH + "\n\n", add_special_tokens=False)["input_ids"]
    prompt_ids = fill_to([tokenizer.bos_token_id], lambda: paragraph_ids, num_tokens)
    return prompt_ids, lambda ids: tokenizer.decode(list(ids))


def build_prompts(encode: Callable[[str], list[int]], num_prompts: int, num_tokens: int, seed: int) -> list[list[int]]:
    """Exactly `num_tokens` ids each: BOS, "Request i.", then SENTENCES shuffled by (seed, i), repeated as needed."""
    prompts = []
    for i in range(num_prompts):
        rng = random.Random(f"{seed}:{i}")
        first = encode(f"Request {i}. " + shuffled(rng))
        prompts.append(fill_to(first, lambda rng=rng: encode(" " + shuffled(rng))[1:], num_tokens))  # [1:]: no BOS
    return prompts


def shuffled(rng: random.Random) -> str:
    """Every sentence once, in an order drawn from `rng`."""
    return " ".join(rng.sample(SENTENCES, len(SENTENCES)))


@dataclass(frozen=True)
class Workload:
    """Token pieces of every (user, turn) and the order the turns are sent in.

    prompt(u, t) = pieces[u][0] + answers[u][0] + pieces[u][1] + ... + answers[u][t-1] + pieces[u][t]
    """

    pieces: tuple[tuple[tuple[int, ...], ...], ...]  # [user][turn]
    order: tuple[tuple[int, int], ...]  # (user, turn), in sending order
    num_answer_tokens: int

    def prompt(self, user: int, turn: int, answers: dict[tuple[int, int], Sequence[int]]) -> list[int]:
        ids: list[int] = []
        for t in range(turn):
            ids += self.pieces[user][t]
            ids += answers[user, t]
        return ids + list(self.pieces[user][turn])

    async def run_turns(
        self, concurrency: int, send: Callable[[int, int, list[int]], Awaitable[tuple[Sequence[int], T]]]
    ) -> list[T]:
        """Send every turn in `order`, each after its user's previous turn ended (its prompt holds
        the answers so far), at most `concurrency` in flight: send(user, turn, prompt) returns the
        answer's ids and what the caller keeps of the turn; those, in sending order."""
        answers: dict[tuple[int, int], Sequence[int]] = {}
        done = {key: asyncio.Event() for key in self.order}
        slots = asyncio.Semaphore(concurrency)

        async def one(user: int, turn: int, prompt: list[int]) -> T:
            try:
                ids, kept = await send(user, turn, prompt)
                answers[user, turn] = ids
                return kept
            finally:
                done[user, turn].set()
                slots.release()

        tasks = []
        for user, turn in self.order:
            if turn > 0:
                await done[user, turn - 1].wait()
            await slots.acquire()
            tasks.append(asyncio.create_task(one(user, turn, self.prompt(user, turn, answers))))
        return list(await asyncio.gather(*tasks))

    def num_prompt_tokens(self, user: int, turn: int) -> int:
        return sum(len(p) for p in self.pieces[user][: turn + 1]) + turn * self.num_answer_tokens

    @property
    def num_max_conversation_tokens(self) -> int:
        """Tokens of the longest conversation at its end: last prompt + last answer."""
        return max(self.num_prompt_tokens(u, len(turns) - 1) for u, turns in enumerate(self.pieces)) + self.num_answer_tokens


def build_workload(
    encode: Callable[..., list[int]],
    num_users: int,
    num_turns: int,
    num_system_tokens: int,
    num_answer_tokens: int,
    seed: int,
    num_visitors: int = 0,
) -> Workload:
    """Users, their messages and the round-robin order, all from `seed`. Each round also brings
    `num_visitors` one-off visitors (one turn each, under the same system prompt) at random
    places: blocks seen once, which a recency-only policy keeps ahead of returning users'."""
    rng = random.Random(seed)
    system_ids = fill_to(
        encode(SYSTEM_PROMPT, add_bos=False), lambda: encode(" " + SYSTEM_PROMPT, add_bos=False), num_system_tokens
    )
    head = encode("<start_of_turn>user\n", add_bos=True) + system_ids  # BOS first
    topics = [TOPICS[u % len(TOPICS)] for u in range(num_users)]
    pieces = []
    for user, (topic, detail) in enumerate(topics):
        opening = f"\n\nHi, this is customer {user + 1}. I need help with {topic}. {detail}"
        turns = [tuple(head + encode(opening + "<end_of_turn>\n<start_of_turn>model\n", add_bos=False))]
        for _ in range(1, num_turns):
            message = f"{rng.choice(FOLLOW_UPS)} (This is still about {topic}.)"
            turns.append(
                tuple(
                    encode(f"<end_of_turn>\n<start_of_turn>user\n{message}<end_of_turn>\n<start_of_turn>model\n", add_bos=False)
                )
            )
        pieces.append(tuple(turns))
    order = []
    for turn in range(num_turns):
        users = list(range(num_users))
        round_rng = random.Random(f"{seed}:{turn}")
        round_rng.shuffle(users)
        for _ in range(num_visitors):
            topic, detail = TOPICS[len(pieces) % len(TOPICS)]
            question = f"\n\nHello, visitor {len(pieces) + 1} here, one quick question about {topic}. {detail}"
            pieces.append((tuple(head + encode(question + "<end_of_turn>\n<start_of_turn>model\n", add_bos=False)),))
            users.insert(round_rng.randrange(len(users) + 1), len(pieces) - 1)
        order += [(u, 0 if u >= num_users else turn) for u in users]
    return Workload(tuple(pieces), tuple(order), num_answer_tokens)


def unbounded_cache(workload: Workload, block_size: int) -> tuple[float, int]:
    """(prefix hit rate, blocks cached at the end) of a cache that never evicts, requests served one
    at a time in order: the ceiling of any policy, and the working set it needs. Answers are stand-in
    ids (only which tokens are equal matters)."""
    answers = {
        (u, t): tuple(
            -1 - (u * len(workload.pieces[0]) + t) * workload.num_answer_tokens - i for i in range(workload.num_answer_tokens)
        )
        for u, t in workload.order
    }
    cached: set[tuple[int, ...]] = set()  # token prefixes ending at a block boundary
    num_hits = num_tokens = 0
    for user, turn in workload.order:
        prompt = workload.prompt(user, turn, answers)
        num_blocks = 0
        while num_blocks < (len(prompt) - 1) // block_size and tuple(prompt[: (num_blocks + 1) * block_size]) in cached:
            num_blocks += 1
        num_hits += num_blocks * block_size
        num_tokens += len(prompt)
        written = prompt + list(answers[user, turn][:-1])  # the last answer token's KV is never computed
        cached.update(tuple(written[: (b + 1) * block_size]) for b in range(len(written) // block_size))
    return num_hits / num_tokens, len(cached)


# An array of at least 100 small objects: no reply completes it before max_tokens, so a constrained
# request runs as long as a free one and the two batches generate the same number of tokens.
SERVING_SCHEMA = {
    "type": "array",
    "minItems": 100,
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
        "required": ["id", "name", "ok"],
        "additionalProperties": False,
    },
}
