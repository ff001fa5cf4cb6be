"""Scaling laws as data, the Huber/BFGS fitter, comparison, bootstrap, D*, compute-optimal allocation, plots.

Pure numerics on tables: pandas in, dataclasses/JSON out. Imports nothing else of ours (and no torch).

Modules, one job each: laws (the registry), data (reading and checking tables), fit (the fitter), compare (LOO,
extrapolation, AIC/BIC), bootstrap (cluster/point resampling, percentile intervals), summary (the fit report of
`upscale fit --json`, grouped fits), dstar (D*, catch-up budget, verdict), optimal (compute-optimal upcycling),
analysis (the paper's whole procedure as one function), diagnostics (alpha(D1), A(D1)), plots (PNG), synthetic
(SYNTHETIC tables from the paper's Table 2), curve_law (the multi-power law of a loss curve under an LR schedule),
curve_observations (decay ends predicted from trunk curves, as weighted rows), evidence (what a D* rests on:
observed or predicted decays).

Glossary (names follow the paper; counts, never billions):
    D       tokens of a from-scratch run (dense or MoE)        N       its non-embedding parameters
    D1      dense tokens before upcycling (the sunk cost)      D2      tokens of MoE training after upcycling
    N1      dense model parameters                             N2      active MoE parameters
    P       sparsity N_total / N2                              loss    validation cross-entropy, nats
    A, B, F scales of the power-law terms                      E       irreducible loss
    alpha*, beta*  exponents; alpha3/beta3 the interaction     trunk   WSD trunk a point was decayed from
    D*      tokens where MoE from scratch overtakes upcycling at the same sunk cost (Eq. 13)
"""
