"""The keys other than a planned segment's own under which a store may hold the same job, and how they are derived.

A segment is found in the store by its key (`SegmentSpec.id`). Two things give the same job another key, and this
module computes those keys for a plan (the store matches them: `Store.holdings`, `Store.other_cut_holdings`, compared in
orchestrator/plan_in_store.py):

- Training-semantics versions. A segment's key carries the version of what training computes
  (`segments.TRAINING_SEMANTICS`, the spec's `semantics`; bumped by hand in the change that alters the result of
  training the same spec). Version 1 is left out of the hash, so a version-1 key is the job's *unversioned* key, and
  `unversioned_id` gives that key for the same job under any version (its parents' unversioned keys included). A done
  segment of the same job under another version is *stale*: reported, retrained, or taken over only when the user
  asks (`--reuse-stale`), since its result came from other code (docs/conventions.md, "Content-addressed segments").
- Other cuts of a chain. A trunk is a chain of pieces cut at its branch points and ids chain through parents, so a
  grid grown by an interior budget re-keys every piece after the new cut, and everything downstream, though each is
  the same computation as a segment trained under the coarser cut: the piece ending at e of the chain cut at fewer
  points ends in the same state (its final checkpoint). `other_cuts` finds those keys; a new sweep takes them over
  always (the same computation: no flag), training only the span up to the new branch point (docs/architecture.md,
  "Segments and WSD reuse"). `other_cuts` finds them with the store's help, so planning costs a few keys per
  segment.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from upscale.sweeps.planner import PlannedSegment, trunk_pieces
from upscale.sweeps.segments import TRUNK_KINDS, SegmentSpec, fingerprint

MAX_OTHER_KEYS = 16  # other keys tried per segment (and cuts per chain): bounds the work of planning a wide DAG
MAX_BUDGETS_ADDED = 2  # a chain is looked for as cut at all but this many of its branch points, at most


def unversioned_id(spec: SegmentSpec, parent_unversioned_ids: tuple[str, ...], memo: dict | None = None) -> str:
    """The key ``spec``'s job has under training-semantics version 1, its parents' given as theirs: equal for the same
    job trained under any version. Equals ``spec.id`` at version 1."""
    return fingerprint(spec.model_copy(update={"semantics": 1, "parent_ids": parent_unversioned_ids}), memo)


def unversioned_ids(segments: Sequence[PlannedSegment]) -> dict[str, str]:
    """Segment id -> `unversioned_id` of segments in topological order: what a store matches to find segments trained
    under another version. A parent not among ``segments`` counts as trained under version 1."""
    out: dict[str, str] = {}
    memo: dict = {}
    for s in segments:
        parents = tuple(out.get(p, p) for p in s.spec.parent_ids)
        same = s.spec.semantics == 1 and parents == s.spec.parent_ids
        out[s.id] = s.id if same else unversioned_id(s.spec, parents, memo)
    return out


def coarser_cuts(ends: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """The branch-point sets of the sweeps that ``ends`` (a chain's piece ends, increasing) may have grown from: the
    whole set (the same cuts under parents with other keys) and the subsets missing up to MAX_BUDGETS_ADDED points,
    the larger first (a grid grows a budget or two at a time), at most MAX_OTHER_KEYS of them."""
    sizes = range(len(ends), max(len(ends) - MAX_BUDGETS_ADDED, 1) - 1, -1)
    subsets = (c for k in sizes for c in itertools.combinations(ends, k))
    return itertools.islice(subsets, MAX_OTHER_KEYS)


def other_cuts(segments: Sequence[PlannedSegment], done: Collection[str],
               held: Callable[[Mapping[str, tuple[str, ...]]], Mapping[str, str]]) -> dict[str, str]:
    """Segment id -> the other key a store holds the same job under, for segments in topological order, ``done``
    the ids the store holds under their own key; ``held`` answers for a batch of candidates (segment id -> its other
    keys, at most MAX_OTHER_KEYS each) with the one found per segment. A trunk piece ending at e: the piece ending at
    e of its chain cut at `coarser_cuts` of its branch points. Any other segment: its spec with a parent replaced by
    the other key that parent was found under.

    Candidates are built from what the store holds, not from every other key of every ancestor: a job came after its
    parent's, so a segment can be held under a key only if the parent that key names is held (done, or found under
    its other key). The segments are asked in waves by depth, one ``held`` call each, so a plan costs a few keys
    per segment the store could hold, not the product of every ancestor's alternatives (an 18,000-segment plan once
    spent minutes here)."""
    memo: dict = {}
    chains: dict[str, list[PlannedSegment]] = {}
    depth: dict[str, int] = {}
    for s in segments:
        depth[s.id] = 1 + max((depth[p] for p in s.spec.parent_ids if p in depth), default=0)
        if s.spec.kind in TRUNK_KINDS:
            chains.setdefault(s.trunk, []).append(s)
    found: dict[str, str] = {}

    def parent_options(spec: SegmentSpec) -> list[tuple[str, ...]]:
        """The parent tuples a held job may name: each parent's own key if it is done, the key it was found under."""
        held_as = [[k for k in (p if p in done or p not in depth else None, found.get(p)) if k]
                   for p in spec.parent_ids]
        return list(itertools.product(*held_as))

    def candidates(s: PlannedSegment) -> dict[str, tuple[str, ...]]:
        if s.spec.kind in TRUNK_KINDS:
            chain = [p.spec for p in chains[s.trunk]]
            piece_at = {p.spec.end_tokens: p.id for p in chains[s.trunk]}
            keys: dict[str, list[str]] = {}
            for parents in parent_options(s.spec):
                whole = chain[0].model_copy(update={"parent_ids": parents})
                for cuts in coarser_cuts([p.end_tokens for p in chain]):
                    for old in trunk_pieces(whole, cuts, memo):
                        keys.setdefault(piece_at[old.end_tokens], []).append(fingerprint(old, memo))
            return {k: tuple(o for o in dict.fromkeys(v) if o != k)[:MAX_OTHER_KEYS] for k, v in keys.items()}
        if any(p in found for p in s.spec.parent_ids):
            return {s.id: tuple(fingerprint(s.spec.model_copy(update={"parent_ids": parents}), memo)
                                for parents in parent_options(s.spec)[:MAX_OTHER_KEYS]
                                if parents != s.spec.parent_ids)}
        return {}

    waves: dict[int, list[PlannedSegment]] = {}
    for s in segments:
        if s.spec.kind not in TRUNK_KINDS or s.id == s.trunk:  # a later piece: asked with its chain's first
            waves.setdefault(depth[s.id], []).append(s)
    for d in sorted(waves):
        asked: dict[str, tuple[str, ...]] = {}
        for s in waves[d]:
            asked.update((k, v) for k, v in candidates(s).items() if v)
        if asked:
            found.update(held(asked))
    return found
