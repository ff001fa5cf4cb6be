"""What a sweep's data section implies before any token is read: the tokeniser's vocabulary size."""

from __future__ import annotations

from upscale.sweeps.segments import DataSpec

BYTE_VOCAB = 256


def vocab_size_of(data: DataSpec) -> int:
    """Tokens in the vocabulary of ``data``'s tokeniser: 256 for bytes, `bpe_vocab_size` for a BPE trained on the
    corpus."""
    return BYTE_VOCAB if data.tokenizer == "bytes" else data.bpe_vocab_size
