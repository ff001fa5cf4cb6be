"""Hugging Face round trip on a 0.1B-shaped Llama: `upscale model import` and `model export` against transformers'
own `from_pretrained` / `save_pretrained` of the same model, measured in the same run.

Usage: `.venv/bin/python bench/hf_roundtrip.py [--json] [--vocab 32000] [--repeats 2]`.

A `LlamaForCausalLM` of the sizes.py "0.1B" shape (15 layers, d_model 640, 8 heads, FFN 2560, a 32k vocabulary,
context 1024) is built with random weights by transformers and saved as safetensors. Then, fastest of `--repeats`:

* import: `workers.hf_models.import_hf` (reads the safetensors tensor by tensor, hashes them, writes weights.pt and
  source.json) vs `LlamaForCausalLM.from_pretrained` (builds the model and loads the same files);
* export: `export_hf` of the imported model (writes config, generation config and safetensors, then loads the export
  back with `AutoModelForCausalLM` and compares logits on a probe batch: the verification is part of our figure) vs
  `save_pretrained` of the loaded model.

Ratios are ours / baseline (above 1 = slower than transformers). The export's max logit difference is printed too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from upscale.sweeps.sizes import shape_of
from upscale.workers.hf_models import export_hf, import_hf


def fastest(repeats: int, run: Callable[[int], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for i in range(repeats):
        start = time.perf_counter()
        result = run(i)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    shape = shape_of("0.1B")
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_ff,
                         num_hidden_layers=shape.n_layer, num_attention_heads=shape.n_head,
                         max_position_embeddings=1024, rms_norm_eps=1e-5)
    root = Path(tempfile.mkdtemp(prefix="hf_roundtrip."))
    try:
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(root / "hf")

        def del_dirs(*names: str) -> None:  # each repeat writes into a fresh folder, as a user's first run does
            for n in names:
                shutil.rmtree(root / n, ignore_errors=True)

        def ours_import(i: int) -> dict:
            del_dirs("up")
            return import_hf(root / "hf", root / "up")

        def theirs_import(i: int) -> LlamaForCausalLM:
            return LlamaForCausalLM.from_pretrained(root / "hf", local_files_only=True, dtype=torch.float32)

        def ours_export(i: int) -> dict:
            del_dirs("exp")
            return export_hf(root / "up", root / "exp")

        t_import, report = fastest(args.repeats, ours_import)
        t_load, model = fastest(args.repeats, theirs_import)
        t_export, exported = fastest(args.repeats, ours_export)

        def theirs_export(i: int) -> None:
            del_dirs("base")
            model.save_pretrained(root / "base")

        t_save, _ = fastest(args.repeats, theirs_export)
        size_gb = sum(f.stat().st_size for f in (root / "hf").glob("*.safetensors")) / 1e9
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "model": {"shape": "0.1B", "vocab": args.vocab, "n1": report["params"]["n1"], "safetensors_gb": size_gb},
        "import_s": t_import, "from_pretrained_s": t_load, "import_ratio": t_import / t_load,
        "export_s": t_export, "save_pretrained_s": t_save, "export_ratio": t_export / t_save,
        "export_max_abs_logit_diff": exported["max_abs_logit_diff"], "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"0.1B Llama (vocab {args.vocab}, {size_gb:.2f} GB fp32 safetensors), fastest of {args.repeats}:")
    print(f"  import  {t_import:6.2f} s  vs from_pretrained {t_load:6.2f} s  -> {t_import / t_load:.2f}x")
    print(f"  export  {t_export:6.2f} s  vs save_pretrained {t_save:6.2f} s  -> {t_export / t_save:.2f}x "
          f"(ours loads the export back and checks logits: max diff {exported['max_abs_logit_diff']:.2e})")


if __name__ == "__main__":
    main()
