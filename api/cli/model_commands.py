"""`upscale model init | import | export | expand` and `upscale upcycle`: dense checkpoints, Hugging Face models in and
out, every upcycling method from the command line, and an MoE grown to more experts.

`init`, `import` and `upcycle` write a model directory (workers/weights.py: config.json + weights.pt; `import` adds
source.json and the tokenizer, workers/hf_models.py); `export --format hf` writes a transformers folder and reports
format, architecture, routing_change, max_abs_logit_diff and files. `upcycle` prints the report of
workers/upcycling/report.py; with `--json` its keys are the scripted contract: method,
max_abs_logit_diff, reinit_fraction {gate, up, down}, intact_neuron_fraction, experts_distinct,
params {n1, n2, n_total}; `model expand --json` prints n_expert, topk, max_abs_logit_diff and params {n2, n_total}
([parent, expanded] each). torch and DeepSpeed are imported inside the commands so `upscale --help` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from upscale.api.cli.app import console
from upscale.workers.errors import WorkerError

model_app = typer.Typer(help="Dense model checkpoints.", no_args_is_help=True)


@model_app.command("init")
def model_init(
    out: Annotated[Path, typer.Option(help="Model directory to write (config.json + weights.pt).")],
    size: Annotated[str | None, typer.Option(help="Named size: nano, micro, tiny, or the paper's 15M ... 1B.")] = None,
    n_layer: Annotated[int | None, typer.Option(help="Explicit shape instead of --size: decoder blocks.")] = None,
    d_model: Annotated[int | None, typer.Option(help="Explicit shape: residual width (d_ff = 4·d_model).")] = None,
    n_head: Annotated[int | None, typer.Option(help="Explicit shape: attention heads.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the initialisation.")] = 0,
    vocab_size: Annotated[int, typer.Option(help="Vocabulary size (256 for byte-level text).")] = 4096,
    context: Annotated[int, typer.Option(help="Maximum sequence length.")] = 1024,
) -> None:
    """Write a randomly initialised dense model (the starting point of `upscale upcycle`)."""
    from upscale.workers.errors import validated
    from upscale.workers.model import ModelConfig, build_model
    from upscale.workers.weights import save_model

    shape = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head}
    given = {k: v for k, v in shape.items() if v is not None}
    if (size is None) == (len(given) == 0) or (size is None and len(given) != 3):
        raise WorkerError("give either --size or all of --n-layer, --d-model and --n-head")
    common = {"vocab_size": vocab_size, "context": context}
    cfg = ModelConfig.from_size(size, **common) if size else validated(ModelConfig, **given, **common)
    model = build_model(cfg, seed=seed)
    save_model(out, cfg, model.state_dict())
    name = size or f"{cfg.n_layer}x{cfg.d_model}"
    console.print(f"dense {name}: n1={model.n1():,} non-embedding params -> {out}")


def upcycle_command(
    dense: Annotated[Path, typer.Option(help="Dense model directory (from `upscale model init` or training).")],
    method: Annotated[str, typer.Option(help="naive | drop | noise | llama-moe | router-upcycling | granular | "
                                        "scratch.")],
    experts: Annotated[int, typer.Option(help="Experts per MoE layer (n_expert >= 2).")],
    topk: Annotated[int, typer.Option(help="Experts per token, 1..experts.")],
    out: Annotated[Path, typer.Option(help="MoE model directory to write.")],
    r: Annotated[float, typer.Option(help="drop: fraction of FFN neurons re-initialised, in [0, 1].")] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the method's random draws.")] = 0,
    index_mode: Annotated[str, typer.Option(help="drop: shared (paper) | per_matrix (official code).")] = "shared",
    noise_variant: Annotated[str, typer.Option(help="noise: replace_elementwise (OLMoE) | add_neuronwise.")] = (
        "replace_elementwise"
    ),
    noise_ratio: Annotated[float, typer.Option(help="noise: fraction of entries/neurons hit.")] = 0.5,
    noise_std: Annotated[float, typer.Option(help="noise: std of the noise.")] = 0.02,
    split: Annotated[str, typer.Option(help="llama-moe: independent-random | independent-clustering | "
                                       "sharing-inner | sharing-inter.")] = "independent-random",
    gate: Annotated[str, typer.Option(help="llama-moe: mlp (LLaMA-MoE's tanh gate) | linear.")] = "mlp",
    gate_init: Annotated[str, typer.Option(help="llama-moe: official (N(0, 0.02^2) on every gate layer) | model "
                                           "(--router-init).")] = "official",
    score_scale: Annotated[float | None, typer.Option(help="llama-moe: expert output scale; default experts/topk.")] = (
        None
    ),
    n_residual: Annotated[int, typer.Option(help="llama-moe sharing-inter: always-on residual experts.")] = 1,
    granularity: Annotated[int, typer.Option(help="granular: G = dense d_ff / expert d_ff.")] = 2,
    routers: Annotated[int, typer.Option(help="router-upcycling: routers m; 0 or --experts (the paper's m = n).")] = 0,
    router_init: Annotated[str, typer.Option(help="normal_2_5d | normal_0.02 | uniform_0.02 | kaiming_uniform.")] = (
        "normal_2_5d"
    ),
    routing: Annotated[str, typer.Option(help="softmax_topk (renormalised top-k; top-1 weight 1) | deepspeed.")] = (
        "softmax_topk"
    ),
    calibration: Annotated[Path | None, typer.Option(help="Calibration data for llama-moe sharing-* and "
                                                     "router-upcycling: a .pt [batch, seq] token tensor, or a "
                                                     "text file read as bytes.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Build an MoE from a dense model with one method; write it and report what it preserved."""
    # DeepSpeed logs to stdout when it is first imported; keep stdout for the report alone (`--json` is parsed)
    with contextlib.redirect_stdout(sys.stderr):
        report, cfg, seconds = _upcycle(
            dense, experts, topk, out, {"router_init": router_init, "routing": routing}, calibration,
            method_spec_fields={
                "method": method, "seed": seed, "r": r, "index_mode": index_mode, "noise_variant": noise_variant,
                "noise_ratio": noise_ratio, "noise_std": noise_std, "split": split, "llama_gate": gate,
                "llama_gate_init": gate_init, "score_scale": score_scale, "n_residual": n_residual,
                "granularity": granularity, "n_routers": routers,
            },
        )
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report, cfg, out, seconds)


def _upcycle(
    dense: Path, experts: int, topk: int, out: Path, routing: dict[str, str], calibration: Path | None,
    method_spec_fields: dict[str, Any],
) -> tuple[dict[str, Any], Any, float]:
    import time

    from upscale.workers.upcycling import method_spec, upcycle
    from upscale.workers.upcycling.calibration import load_calibration
    from upscale.workers.upcycling.report import upcycle_report
    from upscale.workers.weights import load_model, save_model

    if out.resolve() == dense.resolve():
        raise WorkerError(f"--out {out} is the dense model directory; write the MoE somewhere else")
    dense_cfg, dense_sd = load_model(dense)
    spec = method_spec(**method_spec_fields)
    if experts < 2:
        raise WorkerError(f"--experts={experts}: an MoE needs at least 2 experts")
    moe_cfg = dense_cfg.updated(n_expert=experts, topk=topk, **routing)
    tokens = load_calibration(calibration, dense_cfg) if calibration is not None else None
    start = time.perf_counter()
    cfg, moe_sd = upcycle(dense_sd, moe_cfg, spec, calibration_tokens=tokens)
    seconds = time.perf_counter() - start
    save_model(out, cfg, moe_sd)
    return upcycle_report(spec, dense_cfg, dense_sd, cfg, moe_sd), cfg, seconds


def _print_report(report: dict[str, Any], cfg: Any, out: Path, seconds: float) -> None:
    t = Table(title=f"{report['method']}: {cfg.n_expert} experts, top-{cfg.topk}, expert d_ff {cfg.d_expert}")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("max |dense - MoE| logit (fp32)", f"{report['max_abs_logit_diff']:.3g}")
    for m, v in report["reinit_fraction"].items():
        t.add_row(f"re-initialised {m} neurons", f"{v:.3f}")
    t.add_row("intact neurons", f"{report['intact_neuron_fraction']:.3f}")
    t.add_row("experts distinct", str(report["experts_distinct"]))
    for k, v in report["params"].items():
        t.add_row(k, f"{v:,}")
    console.print(t)
    console.print(f"upcycled in {seconds:.2f} s -> {out}")


@model_app.command("expand")
def model_expand(
    parent: Annotated[Path, typer.Option(help="Trained MoE model directory (upcycled, or a checkpoint's model/).")],
    factor: Annotated[int, typer.Option(help="m: the expanded model has m x the parent's experts, top-k kept.")],
    out: Annotated[Path, typer.Option(help="Expanded model directory to write.")],
    strategy: Annotated[str, typer.Option(help="uniform (m copies each) | utility (by mean routing score on "
                                          "--calibration).")] = "uniform",
    bias_noise: Annotated[float, typer.Option(help="Noise on the replicas' loss-free routing bias, as a fraction of "
                                              "its std; 0 = exact copies.")] = 0.01,
    r: Annotated[float, typer.Option(help="Drop-Upcycling on the replicas: fraction of neurons re-initialised.")] = 0.0,
    index_mode: Annotated[str, typer.Option(help="with --r: shared (paper) | per_matrix (official code).")] = "shared",
    seed: Annotated[int, typer.Option(help="Seed of the bias noise and re-initialised neurons.")] = 0,
    calibration: Annotated[Path | None, typer.Option(help="Calibration data for --strategy utility: a .pt [batch, "
                                                     "seq] token tensor, or a text file read as bytes.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Grow a trained MoE to factor x its experts with the same top-k (docs/methods.md, "Expansion"); write it and
    report how far its logits moved from the parent's."""
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's import logs to stdout; `--json` is parsed
        from upscale.sweeps.segments import ExpandSpec
        from upscale.workers.errors import validated
        from upscale.workers.upcycling import expand
        from upscale.workers.upcycling.calibration import load_calibration
        from upscale.workers.upcycling.report import expansion_report
        from upscale.workers.weights import load_model, save_model

        if out.resolve() == parent.resolve():
            raise WorkerError(f"--out {out} is the parent model directory; write the expanded model somewhere else")
        parent_cfg, parent_sd = load_model(parent)
        spec = validated(ExpandSpec, factor=factor, strategy=strategy, bias_noise=bias_noise, r=r,
                         index_mode=index_mode, seed=seed)
        tokens = load_calibration(calibration, parent_cfg) if calibration is not None else None
        cfg, sd = expand(parent_sd, parent_cfg, spec, tokens)
        save_model(out, cfg, sd)
        report = expansion_report(parent_cfg, parent_sd, cfg, sd)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console.print(f"{cfg.n_expert // factor} -> {cfg.n_expert} experts, top-{cfg.topk}: max |parent - expanded| "
                  f"logit {report['max_abs_logit_diff']:.3g}, n2 {report['params']['n2'][1]:,}, n_total "
                  f"{report['params']['n_total'][1]:,} -> {out}")


@model_app.command("import")
def model_import(
    hf: Annotated[Path, typer.Option("--hf", help="Local transformers LlamaForCausalLM folder (config.json + "
                                     "safetensors, sharded or not).")],
    out: Annotated[Path, typer.Option(help="Upscale model directory to write (new or empty).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import a Hugging Face Llama checkpoint as an upscale dense model (with its tokenizer and provenance)."""
    from upscale.workers.hf_models import import_hf

    report = import_hf(hf, out)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    s = report["shape"]
    console.print(f"LlamaForCausalLM {s['n_layer']}x{s['d_model']} (heads {s['n_head']}, kv heads "
                  f"{s['n_kv_head'] or s['n_head']}, FFN {s['ffn_width'] or 4 * s['d_model']}): "
                  f"n1={report['params']['n1']:,} non-embedding params -> {out}")


@model_app.command("export")
def model_export(
    model: Annotated[Path, typer.Argument(help="Upscale model directory (dense or MoE).")],
    out: Annotated[Path, typer.Option(help="Folder to write the transformers model to (new or empty).")],
    fmt: Annotated[str, typer.Option("--format", help="Output format: hf (transformers, safetensors).")] = "hf",
    allow_routing_change: Annotated[bool, typer.Option(help="Export even where the target architecture routes "
                                                       "differently (the report says how).")] = False,
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer folder or tokenizer.json to ship with the model "
                                                   "(default: the one recorded at import).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Export a model as a stock transformers architecture: Llama (dense), Mixtral (routed experts) or Qwen2-MoE
    (with a shared expert); AutoModelForCausalLM loads it with no custom code."""
    if fmt != "hf":
        raise WorkerError(f"--format {fmt!r} is not supported; valid: hf")
    from upscale.workers.hf_models import export_hf

    # DeepSpeed logs to stdout when it is first imported; keep stdout for the report alone (`--json` is parsed)
    with contextlib.redirect_stdout(sys.stderr):
        report = export_hf(model, out, allow_routing_change=allow_routing_change, tokenizer=tokenizer)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if report["routing_change"]:
        console.print(f"[yellow]routing change:[/] {report['routing_change']}")
    console.print(f"{report['architecture']}: max |upscale - transformers| logit {report['max_abs_logit_diff']:.3g} "
                  f"(fp32, probe batch) -> {out} ({', '.join(report['files'])})")
