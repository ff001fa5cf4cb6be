"""Scaling laws as data: every law of docs/laws.md is one declaration in a registry.

Every law in the paper is a sum of power-law terms plus a constant, so in log space each term is *linear* in the
fitted coordinates: ``log(A·D1^−α1·D2^(−α2 + α3·log D1)) = a − α1·log D1 − α2·log D2 + α3·log D1·log D2`` with
``a = log A``. A law is therefore declared as a list of terms, each a scale parameter times a product of powers
written as signed exponent monomials (``"A: -alpha1*D1 -alpha2*D2 +alpha3*D1*D2"`` means the term above); the
fitter turns that into one design tensor X[term, row, param] and log L̂ = logsumexp_term(X·θ). That makes the
objective, its exact gradient and the vectorised start-grid screen a handful of numpy products, for every law.

Scale parameters (A, B, E, F) are fitted as their natural log; exponents (alpha*, beta*) as they are. ``bounds``
are the plausible box in user units (a fit that leaves it is flagged, not clipped); ``starts`` are the start grid of
the exponents. Scales need no grid: for every exponent start the fitter solves the scales by linear least squares
(the law is linear in them), which avoids the plateaus where a term is negligible and BFGS stops at once.
``*-exact`` laws use log(1 + D2) in place of log D2 (the paper's footnote 1
and Eq. 8), so that D2 = 0 rows (the upcycled model before MoE training) can be fitted.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from upscale.fitting.errors import FitError

# Column names the laws use (docs/laws.md); the loss column and the optional cluster column for the bootstrap.
LOSS = "loss"
TRUNK = "trunk"
WEIGHT = "weight"  # optional: a row's weight in the fit (1: an observation; less: a predicted decay, fit.py)
# A table the laws read: a DataFrame or any mapping of column name -> array (cheap in inner loops such as D*).
Table = pd.DataFrame | Mapping[str, np.ndarray]
# Columns that must be token counts or parameter counts: positive (D2 may be 0 for the exact laws).
COUNT_COLUMNS = ("D", "N", "D1", "D2", "N1", "P", "N2")


@dataclass(frozen=True)
class Param:
    """One fitted quantity: a scale (fitted as its log) or an exponent (fitted as is)."""

    name: str
    kind: Literal["scale", "exponent"]
    bounds: tuple[float, float]  # plausible range in user units; fits outside it are flagged
    starts: tuple[float, ...]  # start grid of an exponent; empty for scales (solved per start, see fit.py)

    def to_fitted(self, value: float) -> float:
        return float(np.log(value)) if self.kind == "scale" else float(value)

    def to_user(self, value: float) -> float:
        return float(np.exp(value)) if self.kind == "scale" else float(value)


@dataclass(frozen=True)
class Monomial:
    """sign · param · Π log(column): one exponent's contribution to a term's log."""

    param: str
    sign: float
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Term:
    """exp(scale + Σ monomials): one power-law term (a term with no monomials is a constant such as E)."""

    scale: str
    monomials: tuple[Monomial, ...] = ()

    @property
    def columns(self) -> frozenset[str]:
        return frozenset(c for m in self.monomials for c in m.columns)


# Defaults by parameter name. Exponent starts bracket the paper's (0.04-0.16) and the Chinchilla (0.35) values;
# interaction starts its alpha3 = 8e-4 with both signs. A law may override any of them.
_EXPONENT_STARTS = (0.03, 0.08, 0.16, 0.35, 0.7)
_INTERACTION_STARTS = (-0.002, 0.0, 0.001, 0.004)
_INTERACTION_NAMES = ("alpha3", "beta3")


def _default_param(name: str) -> Param:
    if name == "E":
        return Param(name, "scale", (1e-3, 20.0), ())
    if name[0].isupper():
        return Param(name, "scale", (1e-6, 1e8), ())
    if name in _INTERACTION_NAMES:
        return Param(name, "exponent", (-0.1, 0.1), _INTERACTION_STARTS)
    return Param(name, "exponent", (0.0, 3.0), _EXPONENT_STARTS)


_MONOMIAL = re.compile(r"^([+-])([A-Za-z_][A-Za-z0-9_]*)((?:\*[A-Za-z0-9_]+)+)$")


def _parse_term(text: str) -> Term:
    """'A: -alpha1*D1 +alpha3*D1*D2' -> Term('A', ...); 'E' -> a constant term."""
    scale, _, rest = text.partition(":")
    monomials = []
    for token in rest.split():
        m = _MONOMIAL.match(token)
        if m is None:
            raise ValueError(f"bad monomial {token!r} in term {text!r}: write ±param*COL[*COL]")
        monomials.append(Monomial(m.group(2), 1.0 if m.group(1) == "+" else -1.0, tuple(m.group(3)[1:].split("*"))))
    return Term(scale.strip(), tuple(monomials))


@dataclass(frozen=True)
class Law:
    """A scaling law: its terms, parameters, the columns it reads and the column held out to test extrapolation."""

    name: str
    source: str  # where it comes from in the paper
    formula: str  # human-readable, as in docs/laws.md
    terms: tuple[Term, ...]
    params: tuple[Param, ...]
    columns: tuple[str, ...]
    holdout: str  # leave-largest-out: rows at the largest value of this column are predicted, not fitted
    exact: bool = False  # log(1 + D2) in place of log D2
    notes: str = field(default="", compare=False)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise FitError(f"law {self.name!r} has no parameter {name!r}; its parameters are {', '.join(self.param_names)}")

    def log_column(self, column: str, values: np.ndarray) -> np.ndarray:
        """log of a column the law reads (log1p for D2 in the exact laws)."""
        v = np.asarray(values, dtype=float)
        return np.log1p(v) if (self.exact and column == "D2") else np.log(v)

    def log_columns(self, df: Table) -> dict[str, np.ndarray]:
        """log of every column the law reads (log1p for D2 in the exact laws)."""
        return {c: self.log_column(c, df[c]) for c in self.columns}

    def design(self, df: Table) -> np.ndarray:
        """X[term, row, j] with log L̂ = logsumexp_term(X @ θ), θ in the order of ``param_names``."""
        return Design(self)(df)

    def fitted_rows(self, rows: np.ndarray) -> np.ndarray:
        """Parameter rows in user units (columns in ``param_names`` order) in fitted coordinates, as ``predict``
        converts them (the log of a scale, an exponent as is)."""
        rows = np.asarray(rows, dtype=float).reshape(-1, len(self.params))
        return np.column_stack([np.log(rows[:, j]) if p.kind == "scale" else rows[:, j]
                                for j, p in enumerate(self.params)])

    def predict(self, params: dict[str, float], df: Table) -> np.ndarray:
        """L̂ in loss units for every row of ``df`` (params in user units)."""
        theta = np.array([self.param(n).to_fitted(params[n]) for n in self.param_names])
        Z = self.design(df) @ theta
        return np.exp(Z).sum(axis=0)


class Design:
    """A law's design tensor, planned once: where each term's scale and monomials go, and, for the columns held at
    fixed values (``fixed``: column -> value), their logs and the entries that depend on them alone.

    ``Law.design`` is the plan with nothing fixed. D* holds N (or N1) fixed and evaluates the laws at one token count
    after another (grid, brentq steps, bootstrap samples): with the plan made once per N1, filling in X for new
    token counts is a few numpy operations instead of a pass over the law's declaration.
    """

    def __init__(self, law: Law, fixed: Mapping[str, float] | None = None) -> None:
        self.law = law
        self.fixed_logs = {c: law.log_column(c, np.full(1, float(v))) for c, v in (fixed or {}).items()}
        self.free = tuple(c for c in law.columns if c not in self.fixed_logs)
        index = {n: j for j, n in enumerate(law.param_names)}
        self.template = np.zeros((len(law.terms), 1, len(index)))
        # (term, parameter, sign, columns, the entry when it depends on fixed columns alone), in declaration order
        self.fill: list[tuple[int, int, float, tuple[str, ...], np.ndarray | None]] = []
        for k, term in enumerate(law.terms):
            self.template[k, :, index[term.scale]] = 1.0
            for m in term.monomials:
                const = None
                if all(c in self.fixed_logs for c in m.columns):
                    const = m.sign * _product([self.fixed_logs[c] for c in m.columns])
                self.fill.append((k, index[m.param], m.sign, m.columns, const))

    def __call__(self, df: Table) -> np.ndarray:
        """X[term, row, j] for the rows of ``df`` (which needs only the columns not fixed)."""
        logs = {c: self.law.log_column(c, df[c]) for c in self.free}
        n_rows = len(next(iter(logs.values()))) if logs else len(df)
        logs.update(self.fixed_logs)
        X = np.repeat(self.template, n_rows, axis=1)
        for k, j, sign, columns, const in self.fill:
            X[k, :, j] += const if const is not None else sign * _product([logs[c] for c in columns])
        return X


def _product(arrays: list[np.ndarray]) -> np.ndarray:
    """Elementwise product, left to right (what np.prod(..., axis=0) computes, with fixed columns broadcast)."""
    return functools.reduce(operator.mul, arrays)


def declare(
    name: str,
    source: str,
    formula: str,
    terms: list[str],
    holdout: str,
    starts: dict[str, tuple[float, ...]] | None = None,
    exact: bool = False,
    notes: str = "",
) -> Law:
    """Build a Law from its term strings; parameters get the defaults of their name unless ``starts`` overrides."""
    parsed = tuple(_parse_term(t) for t in terms)
    names: list[str] = []
    columns: list[str] = []
    for t in parsed:
        for n in (t.scale, *(m.param for m in t.monomials)):
            if n not in names:
                names.append(n)
        for m in t.monomials:
            columns.extend(c for c in m.columns if c not in columns)
    params = []
    for n in names:
        p = _default_param(n)
        if starts and n in starts:
            p = Param(p.name, p.kind, p.bounds, starts[n])
        params.append(p)
    return Law(name, source, formula, parsed, tuple(params), tuple(columns), holdout, exact, notes)


def exact_variant(law: Law) -> Law:
    """The (1 + D2) form of a law with a D2 column, named ``<name>-exact``."""
    formula = law.formula.replace("D2^", "(1+D2)^")
    return Law(f"{law.name}-exact", law.source + ", exact (1+D2) form", formula, law.terms, law.params,
               law.columns, law.holdout, exact=True, notes="accepts D2 = 0")


_BASE = [
    declare("chinchilla", "Eq. 3", "L = A·D^−alpha + B·N^−beta + E",
            ["A: -alpha*D", "B: -beta*N", "E"], holdout="N"),
    declare("data-mul", "Eq. 8 (the paper's choice)", "L = A·D1^−alpha1 · D2^(−alpha2 + alpha3·log D1) + E",
            ["A: -alpha1*D1 -alpha2*D2 +alpha3*D1*D2", "E"], holdout="D2"),
    declare("data-mul-noint", "Eq. 8 with alpha3 = 0", "L = A·D1^−alpha1 · D2^−alpha2 + E",
            ["A: -alpha1*D1 -alpha2*D2", "E"], holdout="D2"),
    declare("data-add", "Eq. 9", "L = A·D1^−alpha1 + F·D2^(−alpha2 + alpha3·log D1) + E",
            ["A: -alpha1*D1", "F: -alpha2*D2 +alpha3*D1*D2", "E"], holdout="D2"),
    declare("data-add-noint", "Eq. 9 with alpha3 = 0", "L = A·D1^−alpha1 + F·D2^−alpha2 + E",
            ["A: -alpha1*D1", "F: -alpha2*D2", "E"], holdout="D2"),
    declare("config-add", "Eq. 11 (the paper's choice)", "L = A·P^−beta1 + F·N2^−beta2 + E",
            ["A: -beta1*P", "F: -beta2*N2", "E"], holdout="N2"),
    declare("config-mul", "Eq. 17", "L = A·P^−beta1 · N2^(−beta2 + beta3·log P) + E",
            ["A: -beta1*P -beta2*N2 +beta3*P*N2", "E"], holdout="N2"),
    declare("config-mul-noint", "Eq. 17 with beta3 = 0", "L = A·P^−beta1 · N2^−beta2 + E",
            ["A: -beta1*P -beta2*N2", "E"], holdout="N2"),
    declare("config-add-int", "Eq. 18", "L = A·P^−beta1 + F·N2^(−beta2 + beta3·log P) + E",
            ["A: -beta1*P", "F: -beta2*N2 +beta3*P*N2", "E"], holdout="N2"),
    declare("joint", "Eq. 12", "L = A·D1^−alpha1 · D2^(−alpha2 + alpha3·log D1) + B·N1^−beta + E",
            ["A: -alpha1*D1 -alpha2*D2 +alpha3*D1*D2", "B: -beta*N1", "E"], holdout="N1"),
    declare("joint-alt", "Eq. 19", "L = A·D1^−alpha1 + B·D2^−alpha2 · N1^−(beta − alpha3·log D2) + E",
            ["A: -alpha1*D1", "B: -alpha2*D2 -beta*N1 +alpha3*D2*N1", "E"], holdout="N1"),
]

LAWS: dict[str, Law] = {}
for _law in _BASE:
    LAWS[_law.name] = _law
    if "D2" in _law.columns:
        LAWS[f"{_law.name}-exact"] = exact_variant(_law)
# The single-variable power law of Eq. 7 / Fig. 4, fitted per D1 slice by the alpha(D1) diagnostic.
POWER_D2 = declare("power-d2", "Eq. 7", "L = A·D2^−alpha + E", ["A: -alpha*D2", "E"], holdout="D2")


def get_law(name: str) -> Law:
    """The registered law called ``name``; a FitError listing the valid names otherwise."""
    try:
        return LAWS[name]
    except KeyError:
        raise FitError(f"unknown law {name!r}; valid laws: {', '.join(LAWS)}") from None
