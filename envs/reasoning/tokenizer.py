"""A character-level tokenizer with three special tokens, shared by the token envs and toy models.

Ids are laid out as ``[<pad>, <bos>, <eos>, *chars]``: ``pad_id = 0``, ``bos_id = 1``,
``eos_id = 2`` and character ``chars[i]`` has id ``3 + i``. The default character set
(:data:`DEFAULT_CHARS`, 96 characters: digits, space, newline, the 32 ASCII punctuation marks and
the 52 ASCII letters, so ``vocab_size == 99``) encodes every prompt and answer of every task in
:mod:`envs.reasoning.tasks`, and any ASCII completion an LLM may write (``\\boxed{}``,
``Answer:``). A task with a tiny outcome space uses a tiny character set instead
(``CharTokenizer("01")``: ``vocab_size == 5``).

The class is deliberately small and dependency-free so that a tiny transformer can use it
directly and an adapter can mimic it for a Hugging Face tokenizer (``encode``, ``decode``,
``vocab``, ``vocab_size``, ``pad_id``, ``bos_id``, ``eos_id``).
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_CHARS", "SPECIAL_TOKENS", "CharTokenizer"]

#: The special tokens, in id order: padding, beginning of sequence, end of sequence.
SPECIAL_TOKENS: tuple[str, str, str] = ("<pad>", "<bos>", "<eos>")

#: Every printable ASCII character but tab/CR/form feeds, plus newline; digits first.
DEFAULT_CHARS: str = (
    string.digits
    + " \n"
    + "+-*/%=()[]{}<>^&|~"
    + ".,:;?!'\"`_\\#$@"
    + string.ascii_lowercase
    + string.ascii_uppercase
)


class CharTokenizer:
    """Maps each character of ``chars`` to one id, after the special tokens.

    Attributes:
        chars: the characters, in id order (``chars[i]`` has id ``3 + i``).
        vocab: every token as a string, indexed by id (``vocab[0] == "<pad>"``).
        vocab_size: ``len(vocab) == 3 + len(chars)``.
        pad_id, bos_id, eos_id: 0, 1, 2.
        special_ids: ``frozenset({pad_id, bos_id, eos_id})``.
        token_to_id: the inverse of ``vocab``.

    ``encode`` raises a ``ValueError`` on a character outside ``chars`` (naming it);
    ``decode`` drops the special tokens unless ``skip_special=False``.
    """

    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __init__(self, chars: str = DEFAULT_CHARS) -> None:
        if not isinstance(chars, str) or not chars:
            raise ValueError(f"chars must be a non-empty string; got {chars!r}")
        if len(set(chars)) != len(chars):
            duplicates = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"chars must not repeat a character; repeated: {duplicates!r}")
        self.chars: str = chars
        self.vocab: tuple[str, ...] = (*SPECIAL_TOKENS, *chars)
        self.vocab_size: int = len(self.vocab)
        self.special_ids: frozenset[int] = frozenset((self.pad_id, self.bos_id, self.eos_id))
        self.token_to_id: dict[str, int] = {token: i for i, token in enumerate(self.vocab)}
        self._char_to_id = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(chars)}

    def __repr__(self) -> str:
        return f"CharTokenizer(chars={self.chars!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text``, one per character, optionally framed by ``<bos>``/``<eos>``."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str; got {type(text).__name__}")
        try:
            ids = [self._char_to_id[c] for c in text]
        except KeyError as exc:
            raise ValueError(
                f"text contains {exc.args[0]!r}, which is not in this tokenizer's chars "
                f"{self.chars!r}"
            ) from None
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[Any], *, skip_special: bool = True) -> str:
        """The text of ``ids`` (ints or a 1-d integer array); specials dropped or spelled out."""
        out = []
        for token in _as_id_list(ids, self.vocab_size):
            if token in self.special_ids:
                if not skip_special:
                    out.append(self.vocab[token])
            else:
                out.append(self.vocab[token])
        return "".join(out)

    def encode_batch(
        self,
        texts: Sequence[str],
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        length: int | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Right-padded ids ``[n, length]`` (``pad_id``) and the lengths ``[n]`` of ``texts``.

        ``length`` defaults to the longest encoding; a longer encoding raises a ``ValueError``.
        """
        rows = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        longest = max((len(r) for r in rows), default=0)
        if length is None:
            length = longest
        elif isinstance(length, bool) or not isinstance(length, int) or length < longest:
            raise ValueError(
                f"length must be an integer >= {longest} (longest encoding); got {length!r}"
            )
        ids = np.full((len(rows), length), self.pad_id, dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return ids, np.array([len(r) for r in rows], dtype=np.int64)


def _as_id_list(ids: Iterable[Any], vocab_size: int) -> list[int]:
    """``ids`` as a list of Python ints in ``[0, vocab_size)``, else a ValueError naming them."""
    if isinstance(ids, str | bytes):
        raise ValueError(f"ids must be a sequence of integers; got {type(ids).__name__}")
    array = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
    if array.size == 0:
        return []
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"ids must be a 1-d sequence of integers; got shape {array.shape}, dtype {array.dtype}"
        )
    if array.min() < 0 or array.max() >= vocab_size:
        raise ValueError(
            f"ids must lie in [0, {vocab_size}); got min {array.min()}, max {array.max()}"
        )
    return array.tolist()
