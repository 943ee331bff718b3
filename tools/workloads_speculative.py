"""Prompt sets for speculative decoding (tools/bench_speculative.py), as text: each tool encodes them.

INPUT_GROUNDED: a given text is edited, rewritten or summarized, so most of the output repeats
spans of the prompt: the workload where prompt-lookup speculation (vLLM's `ngram`, llama.cpp's
lookup decoding) pays. Written for a base (not instruction-tuned) model: each prompt ends where
the edited copy begins, so the continuation is the copy.

ORDINARY: open-ended prompts whose continuation the prompt does not contain (draft-model speculation).
"""

from __future__ import annotations

_CODE = """def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, email, age = line.strip().split(",")
            if int(age) >= 18:
                users.append({"name": name, "email": email, "age": int(age)})
    return users


def save_users(path, users):
    with open(path, "w") as f:
        for user in users:
            f.write(f"{user['name']},{user['email']},{user['age']}\\n")
"""

_ARTICLE = (
    "The city council met on Tuesday evening to discuss the new bicycle lanes on Main Street. "
    "Supporters said the lanes would make cycling safer and reduce traffic in the town centre, "
    "while several shop owners worried that removing parking spaces would keep customers away. "
    "After two hours of debate, the council voted five to two to build the lanes as a one-year "
    "trial, with a review of traffic, safety and shop sales at the end of the year. Work is "
    "expected to begin in the spring and to take about six weeks."
)

_EMAIL = (
    "Hi Sam, thanks for sending the report on Friday. I read through it over the weekend and I "
    "think the numbers in the second section look right, but the chart on page four uses the old "
    "figures from March. Could you update the chart with the June figures before the meeting on "
    "Thursday? Also, please add a short summary at the top so that the managers can see the main "
    "points quickly. Let me know if you need anything from me. Best, Alex"
)

_STORY = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman named Tomas. "
    "Every morning he rowed his little blue boat out past the rocks, and every evening he came "
    "back with a basket of silver fish for the market. One day, as the sun was setting, he felt "
    "something heavy in his net. When he pulled it up, he found not a fish but a small wooden box, "
    "covered in shells and tied with a golden rope."
)

INPUT_GROUNDED: list[str] = [
    f"Add type hints to this Python code.\n\nOriginal:\n{_CODE}\nWith type hints:\ndef load_users(path: str) -> list[dict]:\n",
    f"Rename the variable `users` to `people` in this code.\n\nOriginal:\n{_CODE}\nRenamed:\ndef load_users(path):\n    people = []\n",
    f"Article: {_ARTICLE}\n\nThe same article, copied word for word:\nThe city council met",
    f"Fix the spelling in this email.\n\nEmail: {_EMAIL.replace('think', 'thnik').replace('figures', 'figuers')}\n\n"
    f"Corrected email: Hi Sam, thanks",
    f"Story: {_STORY}\n\nThe story again, with the fisherman renamed Marco:\nOnce upon a time, in a small village by the sea, "
    "there lived an old fisherman named Marco.",
    f"Article: {_ARTICLE}\n\nSummary, quoting the article's key sentences: The city council",
]

ORDINARY: list[str] = [
    "The capital of France is",
    "Here is a recipe for a simple tomato soup. First,",
    "The three most important inventions of the twentieth century were",
    "Once upon a time, a young girl found a map in her grandmother's attic. The map showed",
    "To learn a new language quickly, the best approach is",
    "The history of the Roman Empire begins with",
]
