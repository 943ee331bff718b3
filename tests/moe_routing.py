"""Which experts an HF mixture-of-experts model routes prompts to (the MoE tests' "every expert
used" precondition)."""

from __future__ import annotations


def experts_used(model: object, prompts: list[list[int]], top_k: int) -> list[set[int]]:
    """Per layer, the experts HF routes some token of `prompts` to (each token's `top_k`)."""
    import torch

    used: list[set[int]] = []
    for prompt in prompts:
        with torch.no_grad():
            out = model(torch.tensor([prompt]), output_router_logits=True)  # type: ignore[operator]
        for i, logits in enumerate(out.router_logits):
            if i == len(used):
                used.append(set())
            used[i].update(logits.topk(top_k, dim=-1).indices.flatten().tolist())
    return used
