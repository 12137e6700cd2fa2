import subprocess
import sys

from stream.fileio import blake3_file
from stream.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer
from tests.stream.conftest import code_docs, math_docs, web_docs

TEXTS = web_docs(60) + code_docs(20) + math_docs(30)


def test_training_is_deterministic_in_process_and_across_hash_seeds(tmp_path):
    cfg = TokenizerConfig(vocab_size=500)
    d1 = train_tokenizer(iter(TEXTS), tmp_path / "a.json", cfg)
    d2 = train_tokenizer(iter(TEXTS), tmp_path / "b.json", cfg)
    assert d1 == d2 == blake3_file(tmp_path / "a.json")
    script = ("import sys; sys.path.insert(0, '.'); from tests.stream.test_tokenizer import TEXTS;"
              "from stream.tokenizer import *; print(train_tokenizer(iter(TEXTS), sys.argv[1], TokenizerConfig(vocab_size=500)))")
    for seed in ("0", "987"):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"p{seed}.json")], check=True,
                             capture_output=True, text=True, env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout.split()
        assert out[-1] == d1


def test_separator_and_llama3_pretokenization(tmp_path):
    train_tokenizer(iter(TEXTS), tmp_path / "t.json", TokenizerConfig(vocab_size=400))
    tok = load_tokenizer(tmp_path / "t.json")
    assert tok.separator_id == 0 and tok.vocab_size <= 400
    toks, offs = tok.encode_documents(["a <|endoftext|> b", "x"])
    assert offs.tolist() == [0, int(offs[1]), toks.size]
    # the separator closes every document and nowhere else: text quoting it stays text
    assert toks[offs[1] - 1] == 0 and toks[-1] == 0 and int((toks == 0).sum()) == 2
    assert tok.decode(toks[:offs[1] - 1]) == "a <|endoftext|> b"
    # Llama 3 splits digit runs into groups of at most three before BPE
    pieces = tok.tokenizer.pre_tokenizer.pre_tokenize_str("1234567 don't")
    assert [p for p, _ in pieces][:3] == ["123", "456", "7"]
    assert "'t" in [p for p, _ in pieces]
    # byte level: anything encodes and decodes losslessly
    s = "naïve 日本語 \t\n x"
    t, _ = tok.encode_documents([s])
    assert tok.decode(t[:-1]) == s
