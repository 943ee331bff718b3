"""The RoPE of the tiny gpt-oss checkpoints the tests build: gpt-oss's YaRN (factor 8) with an
original context of 32 positions, so every prompt past 32 tokens goes beyond it."""

YARN = {
    "rope_type": "yarn",
    "rope_theta": 150_000.0,
    "factor": 8.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 32,
}
