"""Makes the text example's data: sentences of token ids whose topic a small transformer can learn.

    python make_data.py OUT_DIR [--n 1200] [--queries 200] [--length 16] [--vocab 64] [--seed 0]

writes ``OUT_DIR/topics.npz`` (training data: ``x`` int64 token ids (N, L), ``y`` the topic, ``classes``
the topic names, ``node`` a node index per sample for ``cis train --partition node``) and
``OUT_DIR/queries.npz`` (fresh sentences ``x``, ``y`` for ``cis infer``). Each topic owns a few keyword
ids; a sentence is filler ids with two to four keywords of its topic and at most one of another topic
(noise), so the class is in the words, not their place. Needs numpy only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TOPICS = ("sport", "music", "food", "travel")
KEYWORDS = 6  # keyword ids per topic: topic t owns ids t*6 .. t*6+5; the rest of the vocabulary is filler
NODES = 7  # paper-7's nodes: the node column holds 0..6 (the spec's [[nodes]] order)


def sentences(n: int, length: int, vocab: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sentences (int64 ids, (n, length)) and their topics."""
    filler = len(TOPICS) * KEYWORDS
    if vocab <= filler:
        raise SystemExit(f"--vocab {vocab}: expected more than the {filler} keyword ids")
    x = rng.integers(filler, vocab, (n, length))
    y = rng.integers(0, len(TOPICS), n)
    for row, topic in zip(x, y):
        k = rng.integers(2, 5)
        places = rng.choice(length, k + 1, replace=False)
        row[places[:k]] = topic * KEYWORDS + rng.integers(0, KEYWORDS, k)
        if rng.random() < 0.5:  # one keyword of another topic
            other = (topic + rng.integers(1, len(TOPICS))) % len(TOPICS)
            row[places[k]] = other * KEYWORDS + rng.integers(0, KEYWORDS)
    return x.astype(np.int64), y.astype(np.int64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="folder to write topics.npz and queries.npz in")
    p.add_argument("--n", type=int, default=1200, help="training sentences (default 1200)")
    p.add_argument("--queries", type=int, default=200, help="sentences for cis infer (default 200)")
    p.add_argument("--length", type=int, default=16, help="tokens per sentence (default 16)")
    p.add_argument("--vocab", type=int, default=64, help="vocabulary size (default 64; the model's vocab)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    x, y = sentences(args.n, args.length, args.vocab, rng)
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "topics.npz", x=x, y=y, classes=np.array(TOPICS), node=rng.integers(0, NODES, args.n))
    qx, qy = sentences(args.queries, args.length, args.vocab, rng)
    np.savez(args.out / "queries.npz", x=qx, y=qy)
    print(f"{args.out}: topics.npz ({args.n} sentences of {args.length} token ids, {len(TOPICS)} topics), "
          f"queries.npz ({args.queries})")


if __name__ == "__main__":
    main()
