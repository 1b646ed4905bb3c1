"""Failure topics: a group's low results grouped by what they say, named by their own words.

Pure: texts in, topics out, the same for the same input (no model, no download, no clock). The
one rule: a topic keeps its id across re-clusterings when most of its members stay together
(matched by overlap), so its counts over time form a trend. Design: docs/design-notes.md.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
from scipy import sparse
from sklearn.cluster import HDBSCAN
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import CountVectorizer, HashingVectorizer, TfidfVectorizer
from sklearn.preprocessing import normalize

from scoring.frozen import frozen

# The text of one low result, bounded: what a person reads to say what failed.
INPUT_CHARS = 400
OUTPUT_CHARS = 800
JUSTIFICATION_CHARS = 300
JUSTIFICATIONS = 3  # the low members' justifications, lowest first
TEXT_CHARS = INPUT_CHARS + OUTPUT_CHARS + JUSTIFICATIONS * JUSTIFICATION_CHARS

MIN_TOPIC = 5  # fewer results than this are noise, not a topic
MAX_RESULTS = 2_000  # a re-clustering reads at most this many of a group's latest low results
DIMENSIONS = 48  # the clustering space (latent semantic analysis of the hashed n-grams)
CENTROID_FEATURES = 256  # a topic's centre, kept as its heaviest hashed features
OVERLAP = 0.5  # a new cluster takes an old topic's id when it holds this share of the smaller
MERGE = 0.25  # clusters whose centres are this alike (cosine, in the clustering space) are one topic
COHESION = 0.55  # a topic's members are at least this alike to its centre on average, else noise
TERMS = 5
NAME_VOCABULARY = 20_000  # the commonest terms a batch's names are chosen from (bounds their memory)
JOIN_FLOOR = 0.15  # a new result never joins a topic less alike than this (cosine)

# A topic's centre and a new result live in a hashed space: it needs no fitting, so a result is
# placed at once, and 2**16 features a kind keep a centre's mean small.
_WORDS = HashingVectorizer(analyzer="word", ngram_range=(1, 2), n_features=2**16, alternate_sign=False, norm=None)
_CHARS = HashingVectorizer(analyzer="char_wb", ngram_range=(3, 5), n_features=2**16, alternate_sign=False, norm=None)


@frozen
class LowResult:
    """One low result of a group, bounded (``low_result``): its rating's id, what it was about
    (the subject's input and output excerpts) and why it was low (the low members' justifications)."""

    id: str
    subject: str
    reasons: str

    @property
    def text(self) -> str:
        return f"{self.subject}\n{self.reasons}" if self.reasons else self.subject


@frozen
class Topic:
    """A failure topic: its members (result ids), its distinctive terms and its centre."""

    id: str
    members: tuple[str, ...]
    terms: tuple[str, ...]
    centroid: tuple[tuple[int, float], ...]  # (hashed feature, weight), the heaviest first
    radius: float  # the least cosine to the centre a new result needs to join it

    @property
    def name(self) -> str:
        return ", ".join(self.terms[:3])


def low_result(result_id: str, input_text: str, output_text: str, justifications: Iterable[str]) -> LowResult:
    """The bounded text of a low result: the subject's input and output excerpts, and the low
    members' justifications (the caller orders them lowest first)."""
    subject = "\n".join(p for p in (input_text[:INPUT_CHARS], output_text[:OUTPUT_CHARS]) if p)
    reasons = "\n".join(j[:JUSTIFICATION_CHARS] for j in list(justifications)[:JUSTIFICATIONS] if j)
    return LowResult(result_id, subject, reasons)


def term_vectors(texts: Sequence[str]) -> sparse.csr_matrix:
    """Hashed word (1-2) and character (3-5) n-grams, log-scaled and unit length: the space a
    topic's centre lives in. Needs no fitting, so a new result is placed at once."""
    counts = sparse.hstack([_WORDS.transform(texts), _CHARS.transform(texts)]).tocsr()
    counts.data = np.log1p(counts.data)
    return normalize(counts)


def cluster(results: Sequence[LowResult], *, min_size: int = MIN_TOPIC) -> np.ndarray:
    """Each result's cluster (-1: noise). What it was about and why it was low weigh alike (the
    why names the failure; the about, where it happens): TF-IDF of the batch's own word and
    character n-grams of each, reduced (LSA), then density clustering (HDBSCAN), which needs no
    count of clusters and leaves outliers out."""
    if len(results) < 2 * min_size:
        return np.full(len(results), -1)
    parts = [_weighted([r.subject for r in results]), _weighted([r.reasons for r in results])]
    present = [part for part in parts if part is not None]
    if not present:
        return np.full(len(results), -1)
    weighted = normalize(sparse.hstack(present).tocsr())
    dimensions = min(DIMENSIONS, len(results) - 1, weighted.shape[1] - 1)
    if dimensions < 2:
        return np.full(len(results), -1)
    reduced = normalize(TruncatedSVD(n_components=dimensions, random_state=0).fit_transform(weighted))
    labels: np.ndarray = HDBSCAN(min_cluster_size=min_size, min_samples=min_size, copy=True).fit_predict(reduced)
    if labels.max() < 0:  # no split found: all one failure (a topic, if coherent) or all noise
        labels = HDBSCAN(min_cluster_size=min_size, min_samples=min_size, allow_single_cluster=True,
                         copy=True).fit_predict(reduced)
    return _coarsened(reduced, labels)


def _coarsened(points: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Density clustering splits a failure into its variants (each wording of one judge's reason):
    clusters whose centres are alike (MERGE) become one, and a cluster whose members are not
    alike to their centre (COHESION: unrelated texts that are merely dense) is noise."""
    found = sorted({int(label) for label in labels.tolist() if label >= 0})
    centres = {label: normalize(points[labels == label].mean(axis=0, keepdims=True))[0] for label in found}
    root = {label: label for label in found}

    def top(label: int) -> int:
        while root[label] != label:
            label = root[label]
        return label

    for i, a in enumerate(found):
        for b in found[i + 1:]:
            if float(centres[a] @ centres[b]) >= MERGE:
                root[top(b)] = top(a)
    merged = np.array([top(int(label)) if label >= 0 else -1 for label in labels.tolist()])
    for label in set(merged.tolist()) - {-1}:
        members = points[merged == label]
        centre = normalize(members.mean(axis=0, keepdims=True))[0]
        if float((members @ centre).mean()) < COHESION:
            merged[merged == label] = -1
    return merged


def _weighted(texts: list[str]) -> sparse.csr_matrix | None:
    """Unit-length TF-IDF rows of the texts' word (1-2) and character (3-5) n-grams that at least
    two texts share; None when they share none."""
    blocks = []
    for vectorizer in (TfidfVectorizer(analyzer="word", ngram_range=(1, 2), sublinear_tf=True, min_df=2),
                       TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, min_df=2)):
        with contextlib.suppress(ValueError):  # no n-gram shared
            blocks.append(vectorizer.fit_transform(texts))
    return normalize(sparse.hstack(blocks).tocsr()) if blocks else None


def distinctive_terms(texts: Sequence[str], labels: np.ndarray, *, count: int = TERMS) -> dict[int, tuple[str, ...]]:
    """Each cluster's most distinctive terms against the others (class-based TF-IDF: a term's
    share of the cluster's words, weighed by how rare it is across all the low results)."""
    words = CountVectorizer(stop_words="english", ngram_range=(1, 2), token_pattern=r"(?u)\b[^\W\d_]{3,}\b",
                            max_features=NAME_VOCABULARY)
    try:
        counts = words.fit_transform(texts)
    except ValueError:  # no word at all (every text empty or stop words)
        return {int(label): () for label in set(labels.tolist()) if label >= 0}
    vocabulary = words.get_feature_names_out()
    classes = sorted(set(labels.tolist()))
    per_class = np.vstack([np.asarray(counts[labels == label].sum(axis=0), dtype=float).ravel() for label in classes])
    frequency = per_class / np.maximum(per_class.sum(axis=1, keepdims=True), 1.0)
    average = per_class.sum() / len(classes)
    weights = frequency * np.log1p(average / np.maximum(per_class.sum(axis=0), 1.0))
    out: dict[int, tuple[str, ...]] = {}
    for row, label in enumerate(classes):
        if label < 0:
            continue
        order = np.argsort(-weights[row], kind="stable")
        chosen: list[str] = []
        for index in order:
            term = str(vocabulary[index])
            if weights[row, index] <= 0 or len(chosen) == count:
                break
            if any(term in kept or kept in term for kept in chosen):
                continue  # "refund" beside "refund order" says nothing more
            chosen.append(term)
        out[label] = tuple(chosen)
    return out


def topics_of(group_id: str, results: Sequence[LowResult], previous: Sequence[Topic] = (), *,
              min_size: int = MIN_TOPIC) -> tuple[list[Topic], list[str]]:
    """The group's topics over ``results`` (its latest low results, at most MAX_RESULTS), largest
    first, and the ids left as noise. A topic matched to one of ``previous`` keeps its id."""
    results = list(results)[-MAX_RESULTS:]
    texts = [r.text for r in results]
    labels = cluster(results, min_size=min_size)
    noise = [r.id for r, label in zip(results, labels, strict=True) if label < 0]
    found = sorted({int(label) for label in labels.tolist() if label >= 0},
                   key=lambda label: (-int((labels == label).sum()), label))
    if not found:
        return [], noise
    terms = distinctive_terms(texts, labels)
    vectors = term_vectors(texts)
    members = {label: tuple(results[i].id for i in np.flatnonzero(labels == label)) for label in found}
    ids = _matched(members, previous)
    used = {t.id for t in previous} | set(ids.values())
    topics = []
    for label in found:
        if label not in ids:
            ids[label] = _new_id(group_id, members[label], used)
            used.add(ids[label])
        centre, radius = _centre(vectors[labels == label])
        topics.append(Topic(ids[label], members[label], terms.get(label, ()), centre, radius))
    return topics, noise


def nearest(text: str, topics: Sequence[Topic]) -> str | None:
    """The topic a new low result joins at once - the most alike whose radius it is within - or
    None (noise until the next re-clustering)."""
    if not topics:
        return None
    vector = term_vectors([text])
    best, best_id = 0.0, None
    for topic in topics:
        similarity = _cosine(vector, topic.centroid)
        if similarity >= max(topic.radius, JOIN_FLOOR) and similarity > best:
            best, best_id = similarity, topic.id
    return best_id


def _centre(vectors: sparse.csr_matrix) -> tuple[tuple[tuple[int, float], ...], float]:
    """The members' mean, cut to its heaviest features, and the cosine its least alike member has."""
    mean = np.asarray(vectors.mean(axis=0)).ravel()
    heaviest = np.argsort(-mean, kind="stable")[:CENTROID_FEATURES]
    heaviest = heaviest[mean[heaviest] > 0]
    centre = tuple((int(i), float(mean[i])) for i in heaviest)
    cut = np.zeros(vectors.shape[1])
    cut[heaviest] = mean[heaviest]
    norm = float(np.linalg.norm(cut))
    if not norm:
        return centre, 1.0
    similarities = (vectors @ cut) / norm  # rows are unit length
    return centre, float(similarities.min())


def _cosine(vector: sparse.csr_matrix, centre: tuple[tuple[int, float], ...]) -> float:
    """Cosine of a unit-length row and a centre (its features' weights, not unit length)."""
    weights = dict(centre)
    norm = float(np.sqrt(sum(w * w for w in weights.values())))
    if not norm:
        return 0.0
    dot = sum(value * weights.get(int(index), 0.0) for index, value in zip(vector.indices, vector.data, strict=True))
    return float(dot) / norm


def _matched(members: dict[int, tuple[str, ...]], previous: Sequence[Topic]) -> dict[int, str]:
    """Old ids for new clusters, the largest overlaps first (a fragment of an old topic never
    takes its id before the cluster that holds most of it)."""
    pairs = []
    for label, mine in members.items():
        for topic in previous:
            if topic.members:
                shared = len(set(mine) & set(topic.members))
                overlap = shared / min(len(mine), len(topic.members))
                if overlap >= OVERLAP:
                    pairs.append((-overlap, -shared, label, topic.id))
    ids: dict[int, str] = {}
    for _, _, label, topic_id in sorted(pairs):
        if label not in ids and topic_id not in ids.values():
            ids[label] = topic_id
    return ids


def _new_id(group_id: str, members: tuple[str, ...], used: set[str]) -> str:
    """Named by the group and its first member (the same clustering names a topic the same),
    never an id already in use."""
    for salt in range(len(used) + 1):
        candidate = "tp-" + hashlib.blake2b(f"{group_id}\n{min(members)}\n{salt}".encode(), digest_size=8).hexdigest()
        if candidate not in used:
            return candidate
    raise AssertionError("unreachable: more salts than ids in use")
