"""Byte-level BPE trained from scratch with `tokenizers`, Llama-3-style pre-tokenization.

Pre-tokenization is Llama 3's: its regex split (contractions, letter runs, digit groups of at most 3,
punctuation runs, newlines, spaces), then ByteLevel (bytes mapped to printable characters, so every
string encodes and nothing is <unk>). One special token, the end-of-text separator, is added first.
The tokenizer file's blake3 identifies it in manifests and cache keys.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from stream.errors import ConfigError
from stream.fileio import atomic_write_bytes, blake3_bytes

# Llama 3's pre-tokenization pattern (tokenizer.json of Meta-Llama-3), verbatim.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SEPARATOR = "<|endoftext|>"


@dataclass(frozen=True)
class TokenizerConfig:
    """BPE training knobs. 128,256 is OPEN-1B's vocabulary; tests and the demo use a few thousand."""

    vocab_size: int = 128_256
    min_frequency: int = 2  # a pair seen once is noise, not a merge worth a vocabulary slot
    separator: str = SEPARATOR

    def __post_init__(self) -> None:
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) or not 258 <= self.vocab_size <= 1 << 24:
            raise ConfigError(f"tokenizer.vocab_size: expected an int in [258, 2**24], got {self.vocab_size!r}")
        if isinstance(self.min_frequency, bool) or not isinstance(self.min_frequency, int) or self.min_frequency < 0:
            raise ConfigError(f"tokenizer.min_frequency: expected an int >= 0, got {self.min_frequency!r}")
        if not isinstance(self.separator, str) or not self.separator:
            raise ConfigError("tokenizer.separator: expected a non-empty string")


def _empty(separator: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], path: str | Path, config: TokenizerConfig = TokenizerConfig()) -> str:
    """Train on `texts`, write the tokenizer JSON atomically to `path`, return its blake3.

    Deterministic: the trainer counts pairs (order-free) and breaks count ties by the pair itself,
    and the JSON lists the vocabulary by id; tests train twice and compare digests.
    """
    tok = _empty(config.separator)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size, min_frequency=config.min_frequency, show_progress=False,
        special_tokens=[config.separator], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    data = tok.to_str(pretty=False).encode("utf-8")
    atomic_write_bytes(path, data)
    return blake3_bytes(data)


@dataclass
class LoadedTokenizer:
    """A tokenizer file with its digest and separator id."""

    tokenizer: Tokenizer
    digest: str
    separator: str
    separator_id: int

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode_documents(self, texts: list[str], batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of `texts`, each followed by the separator (int32), and document offsets (int64, n+1)."""
        sep = np.array([self.separator_id], dtype=np.int32)
        parts: list[np.ndarray] = []
        lengths = np.empty(len(texts), dtype=np.int64)
        for b in range(0, len(texts), batch):
            # encode_batch_fast: same ids as encode_batch, without computing character offsets
            for i, enc in enumerate(self.tokenizer.encode_batch_fast(texts[b:b + batch], add_special_tokens=False)):
                ids = np.asarray(enc.ids, dtype=np.int32)
                parts.append(ids)
                parts.append(sep)
                lengths[b + i] = ids.size + 1
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return tokens, offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids, special tokens shown."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str | Path, separator: str = SEPARATOR) -> LoadedTokenizer:
    """Load a tokenizer file; the separator must be one of its special tokens."""
    data = Path(path).read_bytes()
    tok = Tokenizer.from_str(data.decode("utf-8"))
    # a document quoting "<|endoftext|>" must not inject a separator: specials are matched as plain text
    tok.encode_special_tokens = True
    sep_id = tok.token_to_id(separator)
    if sep_id is None:
        raise ConfigError(f"tokenizer {path}: separator {separator!r} is not in its vocabulary")
    return LoadedTokenizer(tok, blake3_bytes(data), separator, sep_id)


def sample_texts(docs_by_source: Iterable[Iterable[str]], budget_bytes: Iterable[int]) -> Iterator[str]:
    """Documents in the given order, each source cut after its byte budget: the tokenizer's training sample."""
    for docs, budget in zip(docs_by_source, budget_bytes):
        used = 0
        for text in docs:
            if used >= budget:
                break
            used += len(text.encode("utf-8"))
            yield text
