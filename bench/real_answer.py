"""The answer on this repository's own real runs, against what was measured past them, and what it costs.

Three real grids trained at the demo's scale (bench/data, written by bench/export_curves.py): the demo's
(demo_grid.json), one spanning 64x in budgets (wide64_any_branch.json) and the same moved up 2x
(inside_any_branch.json, budgets to 4.19e6 tokens). bench/data/beyond_probe.json trained upcycled and from scratch
4x past the moved-up grid and found them tied at 1.68e7 tokens at N1 = 131k (and nearly at 32.9k): the measured
crossing the grids' answers are held to.

For each grid and size this prints, from one analysis (`upscale.analyze`): the paper's pair of laws alone (its D*
and 80% interval: parameter noise only, what every answer was before the law forms) and the answer (D*, its 80% and
95% intervals, the runs' bracket); whether the 80% interval holds the measured tie; and the cost: the analysis with
its answers against the same analysis without them (the paper's pair alone), timed in the same run, as a ratio.

    nice -n 10 .venv/bin/python bench/real_answer.py [--bootstrap 100] [--grids inside wide64 demo] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from upscale.fitting.analysis import analyze

DATA = Path(__file__).resolve().parent / "data"
GRIDS = {"inside": "inside_any_branch.json", "wide64": "wide64_any_branch.json", "demo": "demo_grid.json"}
TIE = 1.68e7  # tokens where beyond_probe.json measured upcycled and from scratch tied (N1 = 131k; 32.9k nearly)


def export_tables(path: Path) -> dict[str, pd.DataFrame]:
    """The observation tables of an exported sweep (bench/export_curves.py's JSON), as the analysis reads them."""
    df = pd.DataFrame(json.loads(path.read_text())["observations"])
    both = df.assign(N=df["N1"])
    return {"dense": both[both.kind == "dense"][["D", "N", "loss", "trunk"]].reset_index(drop=True),
            "scratch": both[both.kind == "scratch"][["D", "N", "loss", "trunk"]].reset_index(drop=True),
            "upcycled": df[df.kind == "upcycled"][["D1", "D2", "N1", "loss", "trunk", "method", "r", "n_expert",
                                                  "topk"]].reset_index(drop=True)}


def _iv(iv: dict[str, Any] | None) -> str:
    if iv is None:
        return "—"
    lo = "open" if iv["low_open"] else f"{iv['low']:.3g}"
    hi = "open" if iv["high_open"] else f"{iv['high']:.3g}"
    return f"[{lo}, {hi}]"


def _holds(iv: dict[str, Any] | None, x: float) -> bool:
    return iv is not None and (iv["low_open"] or iv["low"] <= x) and (iv["high_open"] or x <= iv["high"])


def run_grid(name: str, bootstrap: int, seed: int) -> dict[str, Any]:
    tables = export_tables(DATA / GRIDS[name])
    start = time.perf_counter()
    plain = analyze(tables, bootstrap=bootstrap, seed=seed, answers=False)
    before_s = time.perf_counter() - start
    start = time.perf_counter()
    analysis = analyze(tables, bootstrap=bootstrap, seed=seed)
    after_s = time.perf_counter() - start
    rows = []
    for r in analysis.upcycled[0].dstar["results"]:
        rows.append({"n1": r["n1"], "law_dstar": r["law_dstar"], "law_80": r["parameter_intervals"]["80"]
                     if r.get("parameter_intervals") else None, "dstar": r["dstar"], "state": r["dstar_state"],
                     "answer_80": r["intervals"]["80"], "answer_95": r["intervals"]["95"],
                     "bracket": [(r["answer"]["observed_bracket"] or {}).get("low"),
                                 (r["answer"]["observed_bracket"] or {}).get("high")],
                     "law_holds_tie": _holds(r["parameter_intervals"]["80"] if r.get("parameter_intervals") else None,
                                             TIE),
                     "answer_holds_tie": _holds(r["intervals"]["80"], TIE)})
    backtest = (analysis.upcycled[0].answer or {}).get("backtest", {}).get("line", "")
    return {"grid": name, "bootstrap": bootstrap, "paper_pair_s": before_s, "answer_s": after_s,
            "ratio": after_s / before_s, "rows": rows, "backtest": backtest, "plain_points": plain.points}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", type=int, default=100, help="cluster-bootstrap refits per fit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grids", nargs="+", default=list(GRIDS), choices=list(GRIDS), help="which real grids")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    out = []
    for name in args.grids:
        res = run_grid(name, args.bootstrap, args.seed)
        out.append(res)
        print(f"== {name} (bootstrap {args.bootstrap}): analysis {res['answer_s']:.1f} s with the answer, "
              f"{res['paper_pair_s']:.1f} s with the paper's pair alone: {res['ratio']:.2f}x")
        print(f"   backtest: {res['backtest']}")
        print(f"   {'N1':>9} | {'paper pair D*':>13} {'its 80%':>22} | {'answer D*':>10} {'80%':>22} {'95%':>22} | "
              f"holds {TIE:.3g}: paper / answer")
        for r in res["rows"]:
            star = f"{r['dstar']:.3g}" if r["dstar"] else r["state"]
            law = f"{r['law_dstar']:.3g}" if r["law_dstar"] else "—"
            print(f"   {r['n1']:>9.3g} | {law:>13} {_iv(r['law_80']):>22} | {star:>10} {_iv(r['answer_80']):>22} "
                  f"{_iv(r['answer_95']):>22} | {r['law_holds_tie']} / {r['answer_holds_tie']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
