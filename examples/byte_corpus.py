"""The shipped text corpus as byte tokens: a byte-level tokenizer and a batch sampler for examples/train_llama.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

VOCAB_SIZE = 256  # one token per byte value
CORPUS = Path(__file__).parent / "data" / "alice_in_wonderland.txt"


def encode(text: str) -> np.ndarray:
    """UTF-8 bytes of ``text`` as a ``[len]`` int32 token array (values 0–255)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def decode(tokens) -> str:
    """The text of byte tokens (an int sequence or array); invalid UTF-8 becomes U+FFFD."""
    return bytes(np.asarray(tokens, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


def load_splits(path: Path = CORPUS, held_out: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``(train, evaluation)`` int32 token arrays of the corpus at ``path``; the last ``held_out`` is evaluation."""
    tokens = encode(path.read_text(encoding="utf-8"))
    split = int(len(tokens) * (1 - held_out))
    return tokens[:split], tokens[split:]


def batches(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless ``(inputs, labels)`` batches of random windows of ``tokens``, each ``[batch_size, seq_len]`` int32.

    ``labels`` are ``inputs`` shifted by one token. The same ``seed`` gives the same batches.

    Raises:
        ValueError: ``seq_len + 1`` tokens do not fit in ``tokens``, or a size is not positive.
    """
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
    if seq_len + 1 > len(tokens):
        raise ValueError(f"seq_len={seq_len} needs at least {seq_len + 1} tokens, the corpus split has {len(tokens)}")
    rng = np.random.default_rng(seed)
    offsets = np.arange(seq_len + 1)
    while True:
        starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
        windows = tokens[starts[:, None] + offsets[None, :]]
        yield windows[:, :-1], windows[:, 1:]
