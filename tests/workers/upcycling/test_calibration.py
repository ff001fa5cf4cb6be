"""Calibration data for the data-driven methods: files -> tokens, validation, groups, balanced k-means."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig, seeded_generator
from upscale.workers.upcycling.calibration import load_calibration, sequence_groups
from upscale.workers.upcycling.clustering import kmeans


def test_text_file_becomes_byte_sequences(tmp_path: Path) -> None:
    cfg = ModelConfig(n_layer=1, d_model=32, n_head=2, vocab_size=256, context=16)
    text = tmp_path / "corpus.txt"
    text.write_bytes(bytes(range(256)) * 2)
    tokens = load_calibration(text, cfg, seq_len=100, max_seqs=5)
    assert tokens.shape == (5, 16) and tokens.dtype == torch.int64  # sequences cut at the model context
    assert tokens[1].tolist() == list(range(16, 32))
    pt = tmp_path / "tokens.pt"
    torch.save(torch.arange(64).view(4, 16), pt)
    assert torch.equal(load_calibration(pt, cfg), torch.arange(64).view(4, 16))


def test_bad_calibration_input(tmp_path: Path) -> None:
    cfg = ModelConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, context=16)
    with pytest.raises(WorkerError, match="does not exist"):
        load_calibration(tmp_path / "nope.txt", cfg)
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(WorkerError, match="needs vocab_size >= 256; the model has 64"):
        load_calibration(tmp_path / "a.txt", cfg)
    torch.save(torch.zeros(4, 32, dtype=torch.long), tmp_path / "long.pt")
    with pytest.raises(WorkerError, match=r"sequence length 32 must be in \[2, 16\]"):
        load_calibration(tmp_path / "long.pt", cfg)
    torch.save(torch.zeros(4, 8), tmp_path / "float.pt")
    with pytest.raises(WorkerError, match="non-empty integer"):
        load_calibration(tmp_path / "float.pt", cfg)


def test_groups_need_one_sequence_per_expert(dense_sd: dict, tokens: torch.Tensor) -> None:
    with pytest.raises(WorkerError, match=r"need at least 16 calibration sequences .* got 8"):
        sequence_groups(dense_sd, tokens, 16, seed=0)


@pytest.mark.parametrize("n", [12, 10])
def test_balanced_kmeans_sizes(n: int) -> None:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    labels = kmeans(x, 4, seeded_generator(0, 9), balanced=True)
    counts = torch.bincount(labels, minlength=4)
    assert counts.min() >= 1 and counts.max() <= -(-n // 4)  # every cluster used, none above ceil(n/k)
    if n % 4 == 0:
        assert counts.tolist() == [3, 3, 3, 3]
    assert torch.equal(labels, kmeans(x, 4, seeded_generator(0, 9), balanced=True))
    with pytest.raises(WorkerError, match="cannot form 4 clusters from 3 points"):
        kmeans(x[:3], 4, seeded_generator(0, 9))
