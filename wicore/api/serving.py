"""What the app needs of an engine: the seam between the HTTP API and whatever runs requests.

`wicore serve` gives the app a `wicore.runtime.Engine`; `wicore serve --replicas N` gives it a
client of engine replicas on a Ray cluster (wicore.serve_ray.client). The app only ever calls
what is here.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from wicore.executor.constrained import Grammars
    from wicore.inputs.tokenizer import Tokenizer
    from wicore.model.vision import VisionConfig
    from wicore.types.images import ImageInput
    from wicore.types.outputs import Priority, RequestOutput
    from wicore.types.sampling import SamplingParams


class Images(Protocol):
    """What the app reads of a model's image encoder: its config (preprocessing, the image tokens).
    An Engine's VisionEncoder; an engine elsewhere's ImagePlacement (wicore.types.images)."""

    @property
    def config(self) -> VisionConfig: ...


class ServingEngine(Protocol):
    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def vision(self) -> Images | None:
        """The image encoder, or None for a model (or a server) that takes no images."""

    @property
    def grammars(self) -> Grammars | None:
        """The output constraints' compiler, which the app runs on a worker thread before queuing (so a
        big schema neither stalls the event loop nor the engine, and one that does not compile is a 400
        at once); None for an engine elsewhere (Ray replicas compile when the request reaches them)."""

    @property
    def max_sequence_tokens(self) -> int:
        """Most tokens one request may reach (prompt and generated)."""

    @property
    def max_waiting(self) -> int:
        """Requests the queue holds at most: a batch of more can never be admitted whole."""

    def expand_images(self, text: str) -> str: ...

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        priority: Priority | str = ...,
        deadline: float | None = None,
        request_id: str | None = None,
        images: Sequence[ImageInput] = (),
    ) -> str:
        """Queue a request (see Engine.add_request); refusals raise WiCoreError, now or, for an
        engine elsewhere, from its outputs."""

    def abort(self, request_id: str) -> None:
        """End the request; its outputs can still be read, the last one finished ("abort")."""

    def cancel(self, request_id: str) -> None:
        """End a request whose outputs nobody will read."""

    def outputs(self, request_id: str) -> AsyncIterable[RequestOutput]:
        """The request's outputs in order, the last one finished (claims them: read once)."""

    def stats_json(self) -> dict[str, object]:
        """Queues, KV blocks and counters in /v1/stats' JSON shape (`EngineStats.to_dict()`; a
        cluster adds its replicas')."""
