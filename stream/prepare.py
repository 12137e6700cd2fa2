"""Prepare a corpus declared in a config file: train its tokenizer if it has none, then hash, tokenize
and write the manifest. The demo corpus goes through the same two calls."""
from __future__ import annotations

from pathlib import Path

from stream.manifest import Manifest, build_manifest
from stream.readers import read_documents
from stream.sources import load_corpus_config
from stream.tokenizer import TokenizerConfig, sample_texts, train_tokenizer


def prepare_corpus(config_path: str | Path, vocab_size: int = 128_256, sample_bytes: int = 64 << 20,
                   progress: bool = True) -> Manifest:
    """Tokenizer (trained on a sample split by token share, if absent) + manifest + tokenized cache."""
    corpus = load_corpus_config(config_path)
    root = Path(corpus.root)
    if not (root / corpus.tokenizer).is_file():
        total = sum(s.share for s in corpus.sources)

        def docs(src):  # documents in declared shard order: the sample is the front of each source
            for rel in src.shards:
                yield from read_documents(root / rel, src.text_column).texts

        train_tokenizer(sample_texts((docs(s) for s in corpus.sources),
                                     [int(sample_bytes * s.share / total) for s in corpus.sources]),
                        root / corpus.tokenizer, TokenizerConfig(vocab_size=vocab_size))
    return build_manifest(corpus, progress=progress)
