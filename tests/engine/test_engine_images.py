"""Image prompts through the engine against HF transformers (the issue's acceptance, fp32).

The oracle is a tiny random Gemma3ForConditionalGeneration (tests/multimodal.py): its processor
makes the prompt ids and pixel values, its forward pass the logits, its `generate` the greedy
tokens. The engine gets the same conversation through the chat template and its own image
loading. The image's 16 soft tokens are wider than the sliding window (8), the KV blocks hold 4
tokens, and a step takes at most 16 prompt tokens, so chunks stop before images and sliding
layers release blocks inside them.
"""

from __future__ import annotations

import numpy as np
import pytest
from multimodal import png, user
from tiny_engine import tiny_config

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.errors import RequestError
from wicore.inputs.image_loader import load_image
from wicore.model.vision import ImagePreprocessing
from wicore.types.sampling import SamplingParams

IMAGES = [png(1), png(2, (90, 33), "JPEG"), png(3, (20, 20), "WEBP")]
LONG = " ".join(["the red cat sits on a blue mat next to a green dog"] * 4)
CASES = {  # name: (conversation, its images in order)
    "one image": (user("What is in this picture?", IMAGES[0], "Describe the image."), IMAGES[:1]),
    "two images": (user("Compare", IMAGES[0], "and", IMAGES[1], "which one is brighter?"), IMAGES[:2]),
    "image in the middle": (user("A red cat", IMAGES[2], "sits on a blue mat."), IMAGES[2:]),
    "past the window": (user(IMAGES[1], LONG), IMAGES[1:2]),
    "text only": (user("hello world, what colors and shapes?"), []),
}


@pytest.fixture(scope="module")
def engine(tiny_multimodal):
    config = tiny_config(tiny_multimodal.export(), scheduler=SchedulerConfig(prefill_chunk=7))  # raised to one image's 16 tokens
    with Engine(config) as eng:
        yield eng


def prompt(eng: Engine, tiny, name: str) -> tuple[list[int], list, dict]:
    """Our ids and images for a case, HF's inputs for it; the ids must be HF's."""
    messages, images = CASES[name]
    text = eng.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = eng.tokenizer.encode(eng.expand_images(text) if images else text, add_bos=False)
    inputs = tiny.inputs(messages, images)
    assert ids == inputs["input_ids"][0].tolist()
    return ids, [load_image(b, eng.vision.config.preprocessing) for b in images], inputs


def test_prompt_logits_equal_hf_for_images_batched_with_text(engine, tiny_multimodal):
    prompts, images, refs = [], [], []
    for name in CASES:
        ids, imgs, inputs = prompt(engine, tiny_multimodal, name)
        prompts.append(ids)
        images.append(imgs)
        refs.append(tiny_multimodal.logits(inputs))
    steps, encoded = engine.num_steps, engine.vision.num_encoded
    done = engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logits=True), images=images)
    assert engine.vision.num_encoded - encoded == 3  # image 0 is in two prompts: encoded once
    assert engine.num_steps - steps > 1  # the prompts ran in chunks, together
    for name, completion, ref in zip(CASES, done, refs):
        assert completion.error is None
        assert completion.prompt_logits.shape == ref.shape, name
        assert np.abs(completion.prompt_logits - ref).max() <= 1e-4, name


@pytest.mark.parametrize("name", ["two images", "past the window"])
def test_greedy_tokens_equal_hf_generate(engine, tiny_multimodal, name):
    import torch

    ids, imgs, inputs = prompt(engine, tiny_multimodal, name)
    with torch.no_grad():
        ref = tiny_multimodal.model.generate(**inputs, max_new_tokens=10, do_sample=False)[0, len(ids) :].tolist()
    (completion,) = engine.generate([ids], SamplingParams(max_tokens=10, temperature=0), images=[imgs])
    assert completion.token_ids == ref[: len(completion.token_ids)] and completion.token_ids


def test_the_prefix_cache_tells_images_apart(engine, tiny_multimodal):
    """The same ids with another image reuse only the blocks before the image; with the same
    image, everything up to the last block. Both still generate HF's tokens."""
    import torch

    messages = user("Compare", IMAGES[0], "which one is brighter?")
    greedy = SamplingParams(max_tokens=4, temperature=0)
    for image, cached_before in ((IMAGES[0], None), (IMAGES[1], "image"), (IMAGES[1], "all")):
        text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = engine.tokenizer.encode(engine.expand_images(text), add_bos=False)
        inputs = tiny_multimodal.inputs(messages, [image])
        before = engine.stats().cached_prompt_tokens
        (completion,) = engine.generate([ids], greedy, images=[[load_image(image, engine.vision.config.preprocessing)]])
        cached = engine.stats().cached_prompt_tokens - before
        start = ids.index(engine.vision.config.image_token_id)
        if cached_before == "image":
            assert cached == start // 4 * 4  # the blocks before the first image token
        elif cached_before == "all":
            assert cached == (len(ids) - 1) // 4 * 4
        with torch.no_grad():
            ref = tiny_multimodal.model.generate(**inputs, max_new_tokens=4, do_sample=False)[0, len(ids) :].tolist()
        assert completion.token_ids == ref[: len(completion.token_ids)]


def test_images_and_placeholders_must_agree(engine):
    text = engine.tokenizer.apply_chat_template(user("Describe", IMAGES[0]), add_generation_prompt=True)
    image = load_image(IMAGES[0], engine.vision.config.preprocessing)
    with pytest.raises(RequestError, match="1 image placeholder"):
        engine.add_request(text, SamplingParams(max_tokens=1), images=[image, image])
    with pytest.raises(RequestError, match="1 image placeholder"):
        engine.add_request(engine.expand_images(text), SamplingParams(max_tokens=1))


def test_a_model_without_a_vision_partition_refuses_images(tiny_export):
    folder, _ = tiny_export()
    with Engine(EngineConfig(model_dir=folder, num_threads=1, num_device_blocks=16)) as eng:
        assert eng.vision is None
        image = load_image(IMAGES[0], ImagePreprocessing(56, 56))
        with pytest.raises(RequestError, match="no vision partition"):
            eng.add_request([1, 2, 3], SamplingParams(max_tokens=1), images=[image])
