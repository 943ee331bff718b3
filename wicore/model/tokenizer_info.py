"""What a model folder's tokenizer files are and which token ids matter (stored in wicore.json)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from wicore.errors import ManifestError


@dataclass(frozen=True)
class TokenizerInfo:
    """What the runtime needs to know about the tokenizer files of a model folder.

    `eos_token_ids` holds every id that ends generation: the eos token first,
    then end-of-turn tokens (Gemma: `<eos>` 1, `<end_of_turn>` 106).
    `add_bos` says whether plain text is encoded with the bos token in front;
    a rendered chat template already starts with it. `has_chat_template` is False when the
    source shipped no chat template (a base model): `chat_template` is then WiCore's stand-in
    (Gemma 3's for Gemma 3, else one that refuses), and a server refuses chat requests.
    """

    files: tuple[str, ...]
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    add_bos: bool
    chat_template: str
    has_chat_template: bool = True

    def __post_init__(self) -> None:
        if "tokenizer.json" not in self.files:
            raise ManifestError(f"tokenizer files {self.files} lack tokenizer.json; export the model again")
        if self.add_bos and self.bos_token_id is None:
            raise ManifestError("the tokenizer adds a bos token but has no bos_token_id; export the model again")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "files": list(self.files), "eos_token_ids": list(self.eos_token_ids)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenizerInfo:
        try:
            return cls(
                files=tuple(data["files"]),
                bos_token_id=data["bos_token_id"],
                eos_token_ids=tuple(data["eos_token_ids"]),
                pad_token_id=data["pad_token_id"],
                add_bos=bool(data["add_bos"]),
                chat_template=data["chat_template"],
                has_chat_template=bool(data.get("has_chat_template", True)),  # exports before it: as before
            )
        except (KeyError, TypeError) as e:
            raise ManifestError(f"tokenizer entry of the manifest is malformed ({e!r}); export the model again") from e
