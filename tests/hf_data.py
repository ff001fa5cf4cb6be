"""Tiny Hugging Face models, corpora and tokenizers built here with `transformers`, `datasets` and `tokenizers`
(nothing from a hub), for the tests of Hugging Face import and export, sweeps/data_sources.py and workers/data.py."""

from __future__ import annotations

from pathlib import Path

DOCS = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * (5 + i) for i in range(40)]
SPECIAL = ["<s>", "</s>"]


def train_tokenizer(vocab_size: int = 300):  # -> tokenizers.Tokenizer
    """A byte-level BPE trained on DOCS, with <s> added before every document (as Llama's tokenizer does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(DOCS, trainer=trainer)
    bos = ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    return tok


def tokenizer_json(folder: Path, vocab_size: int = 300) -> Path:
    """A tokenizers `tokenizer.json` file."""
    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(vocab_size).save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def tokenizer_folder(folder: Path, vocab_size: int = 300) -> Path:
    """A transformers tokenizer folder (`PreTrainedTokenizerFast.save_pretrained`: tokenizer.json and its config)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(vocab_size), bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))
    return folder


def dataset(docs: list[str] = DOCS, column: str = "body"):  # -> datasets.Dataset
    from datasets import Dataset

    return Dataset.from_dict({column: docs, "id": list(range(len(docs)))})


VOCAB = 96  # of hf_llama's models unless given


def hf_llama(folder: Path, *, tied: bool = False, shard: bool = False, seed: int = 0, **config: object) -> Path:
    """A random LlamaForCausalLM (GQA, FFN width 72 = 2.25·d_model) saved to `folder`; weights scaled up so that
    logits are O(1) and a wrong mapping cannot hide under rounding."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 72, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
              "tie_word_embeddings": tied, **config}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.mul_(5.0)
            else:
                p.add_(torch.randn(p.shape) * 0.1)
    model.save_pretrained(folder, max_shard_size="20KB" if shard else "5GB")
    return folder
