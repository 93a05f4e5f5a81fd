"""envs.reasoning.tokenizer: :class:`CharTokenizer`'s layout, round trip and errors."""

from __future__ import annotations

import numpy as np
import pytest

from envs.reasoning import CharTokenizer


def test_char_tokenizer_layout_and_round_trip():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab[:3] == ("<pad>", "<bos>", "<eos>") and tok.vocab_size == 99
    assert tok.encode("0") == [3] and tok.vocab[tok.token_to_id["+"]] == "+"
    text = "Compute (3 + 5) * 2 mod 7. Answer: \\boxed{42}\n"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("12", add_bos=True, add_eos=True)
    assert ids == [1, 4, 5, 2]
    assert tok.decode(ids) == "12" and tok.decode(ids, skip_special=False) == "<bos>12<eos>"
    assert tok.decode(np.array(ids)) == "12" and tok.decode([]) == ""
    batch, lengths = tok.encode_batch(["1", "123"], add_eos=True)
    np.testing.assert_array_equal(batch, [[4, 2, 0, 0], [4, 5, 6, 2]])
    np.testing.assert_array_equal(lengths, [2, 4])
    bits = CharTokenizer("01")
    assert bits.vocab == ("<pad>", "<bos>", "<eos>", "0", "1") and bits != tok


def test_char_tokenizer_errors():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'é'"):
        tok.encode("café")
    with pytest.raises(ValueError, match="ids"):
        tok.decode([99])
    with pytest.raises(ValueError, match="ids"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="ids"):
        tok.decode("12")
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer("001")
    with pytest.raises(ValueError, match="length"):
        tok.encode_batch(["123"], length=2)
