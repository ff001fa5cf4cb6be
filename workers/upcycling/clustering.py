"""k-means for expert construction: plain (router keys, text groups) and balanced (LLaMA-MoE's equal-size split).

The balanced assignment step is solved exactly with `scipy.optimize.linear_sum_assignment` on the squared-distance
matrix with each centroid replicated ceil(N/k) times (a dependency-light stand-in for
`KMeansConstrained(size_min=size_max=N/k)`); when k divides N every cluster gets exactly N/k points. The first
replica of every centroid gets a large bonus so that no cluster is ever empty (all replicas are filled anyway when
k divides N, so the bonus then changes nothing). Plain k-means re-seeds an empty cluster with the point farthest
from its centroid. Initial centroids are k-means++ draws from the caller's generator: same seed, same labels.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from upscale.workers.errors import WorkerError


def _balanced_labels(dist2: np.ndarray) -> np.ndarray:
    from scipy.optimize import linear_sum_assignment  # ~0.5 s to import; only the balanced split needs it

    n, k = dist2.shape
    cap = math.ceil(n / k)
    cost = np.repeat(dist2, cap, axis=1)  # column c is replica c % cap of centroid c // cap
    cost[:, ::cap] -= 1e6 * (1.0 + dist2.max())
    rows, cols = linear_sum_assignment(cost)
    labels = np.empty(n, dtype=np.int64)
    labels[rows] = cols // cap
    return labels


def _sq_dist(pts: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    # |x|² - 2x·c + |c|²: an [N, k] matrix without the [N, k, D] difference tensor (8192 tokens x d=1504 would be
    # ~0.8 GB); clipped at 0 against rounding
    d2 = (pts**2).sum(1)[:, None] - 2.0 * pts @ centroids.T + (centroids**2).sum(1)[None, :]
    return np.maximum(d2, 0.0)


def _kmeans_pp(pts: np.ndarray, k: int, gen: torch.Generator) -> np.ndarray:
    # k-means++ seeding: each next centre drawn with probability proportional to the squared distance to the nearest
    # chosen one, which avoids two starting centres in one cluster (plain random starts got stuck on planted blobs)
    chosen = [int(torch.randint(len(pts), (1,), generator=gen))]
    d2 = ((pts - pts[chosen[0]]) ** 2).sum(1)
    for _ in range(1, k):
        w = torch.from_numpy(d2) if d2.sum() > 0 else torch.ones(len(pts), dtype=torch.float64)
        chosen.append(int(torch.multinomial(w, 1, generator=gen)))
        d2 = np.minimum(d2, ((pts - pts[chosen[-1]]) ** 2).sum(1))
    return pts[chosen].copy()


def kmeans(x: torch.Tensor, k: int, gen: torch.Generator, balanced: bool = False, max_iter: int = 100) -> torch.Tensor:
    """Cluster the rows of `x` [N, D] into k groups; returns labels [N] (every label 0..k-1 used)."""
    n = x.shape[0]
    if n < k:
        raise WorkerError(f"cannot form {k} clusters from {n} points; give at least {k}")
    pts = x.detach().double().cpu().numpy()
    centroids = _kmeans_pp(pts, k, gen)
    labels = np.full(n, -1, dtype=np.int64)
    for _ in range(max_iter):
        dist2 = _sq_dist(pts, centroids)
        if balanced:
            new = _balanced_labels(dist2)
        else:
            new = dist2.argmin(1)
            for c in range(k):
                if not (new == c).any():
                    far = int(dist2[np.arange(n), new].argmax())
                    new[far] = c
        if (new == labels).all():
            break
        labels = new
        centroids = np.stack([pts[labels == c].mean(0) for c in range(k)])
    return torch.from_numpy(labels)
