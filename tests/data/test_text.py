"""Text to token arrays through a local tokenizer.json: a word-level tokenizer built and saved in
the test (the special tokens of a classifier and GPT-2's end-of-text) round-trips; documents
become a language model's next-token pairs with the end-of-text token after each document,
exactly as written out by hand; a classifier's batch keeps [CLS] ... [SEP] under truncation."""

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from fedjax_dro.data.text import chunk_documents, encode_batch, load_tokenizer  # noqa: E402

VOCAB = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "<|endoftext|>": 3, "[UNK]": 4}
VOCAB.update({w: 5 + i for i, w in enumerate("a b c d e f".split())})


@pytest.fixture
def tokenizer_file(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers, processors

  tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
  )
  path = tmp_path / "tokenizer.json"
  tok.save(str(path))
  return path


def test_a_saved_tokenizer_round_trips(tokenizer_file):
  tok = load_tokenizer(tokenizer_file)
  ids = tok.encode("a b zz c", add_special_tokens=False).ids
  assert ids == [5, 6, 4, 7]
  assert tok.decode(ids) == "a b [UNK] c"


def test_documents_become_next_token_pairs_with_end_of_text(tokenizer_file):
  tok = load_tokenizer(tokenizer_file)
  # stream: a b <eos> c d e <eos> f <eos> = 5 6 3 7 8 9 3 10 3 (9 tokens)
  x, y = chunk_documents(["a b", "c d e", "f"], tok, seq_len=2)
  np.testing.assert_array_equal(x, [[5, 6], [7, 8], [3, 10]])
  np.testing.assert_array_equal(y, [[6, 3], [8, 9], [10, 3]])
  assert x.dtype == np.int32 and y.dtype == np.int32
  x, y = chunk_documents(["a b", "c d e", "f"], tok, seq_len=3, pad_id=0)  # spans of 4
  np.testing.assert_array_equal(x, [[5, 6, 3], [8, 9, 3], [3, 0, 0]])
  np.testing.assert_array_equal(y, [[6, 3, 7], [9, 3, 10], [0, 0, 0]])
  x, _ = chunk_documents(["a b c d e f"], tok, seq_len=2, eos_token=None, max_sequences=1)
  np.testing.assert_array_equal(x, [[5, 6]])


def test_a_classifiers_batch_keeps_its_special_tokens_under_truncation(tokenizer_file):
  tok = load_tokenizer(tokenizer_file)
  batch = encode_batch(["a b c d e", "f"], tok, 4, pad_id=0)
  np.testing.assert_array_equal(batch, [[1, 5, 6, 2], [1, 10, 2, 0]])
  assert tok.encode("a b c d e").ids == [1, 5, 6, 7, 8, 9, 2]  # the caller's tokenizer untouched


def test_bad_inputs_are_named(tokenizer_file, tmp_path):
  tok = load_tokenizer(tokenizer_file)
  with pytest.raises(ValueError, match="is not an existing file"):
    load_tokenizer(tmp_path / "none.json")
  (tmp_path / "bad.json").write_text("{not json")
  with pytest.raises(ValueError, match="cannot be read as a tokenizer.json"):
    load_tokenizer(tmp_path / "bad.json")
  with pytest.raises(ValueError, match="eos_token '<eot>' is not in the tokenizer's vocabulary"):
    chunk_documents(["a"], tok, 2, eos_token="<eot>")
  with pytest.raises(TypeError, match="texts must be a list of strings"):
    chunk_documents("a b", tok, 2)
  with pytest.raises(ValueError, match="seq_len must be a positive integer"):
    chunk_documents(["a"], tok, 0)
