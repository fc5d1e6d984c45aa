"""StringLookup and IntegerLookup against the outputs of Keras 3's own documentation (Keras computes them with
TensorFlow, which real Keras needs for these layers: there is no TensorFlow here to run it), plus adapt's
order, tf-idf, masks, inversion, configs and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dnnbind import layers


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


VOCAB = ["a", "b", "c", "d"]
DATA = [["a", "c", "d"], ["d", "z", "b"]]
DATA4 = [["a", "c", "d", "d"], ["d", "z", "b", "z"]]
IVOCAB = [12, 36, 1138, 42]
IDATA = np.array([[12, 1138, 42], [42, 1000, 36]])
IDATA4 = np.array([[12, 1138, 42, 42], [42, 7, 36, 7]])


def test_string_lookup_matches_keras_docs():
    np.testing.assert_array_equal(np.asarray(layers.StringLookup(vocabulary=VOCAB)(DATA)), [[1, 3, 4], [4, 0, 2]])
    layer = layers.StringLookup()
    layer.adapt(DATA)
    assert layer.get_vocabulary() == ["[UNK]", "d", "z", "c", "b", "a"]
    np.testing.assert_array_equal(np.asarray(layer(DATA)), [[5, 3, 1], [1, 2, 4]])
    two = layers.StringLookup(vocabulary=VOCAB, num_oov_indices=2)
    np.testing.assert_array_equal(np.asarray(two([["a", "c", "d"], ["m", "z", "b"]])), [[2, 4, 5], [0, 1, 3]])
    one_hot = np.asarray(layers.StringLookup(vocabulary=VOCAB, output_mode="one_hot")(["a", "b", "c", "d", "z"]))
    np.testing.assert_array_equal(one_hot, np.eye(5)[[1, 2, 3, 4, 0]])
    multi = np.asarray(layers.StringLookup(vocabulary=VOCAB, output_mode="multi_hot")(DATA4))
    np.testing.assert_array_equal(multi, [[0, 1, 0, 1, 1], [1, 0, 1, 0, 1]])
    count = np.asarray(layers.StringLookup(vocabulary=VOCAB, output_mode="count")(DATA4))
    np.testing.assert_array_equal(count, [[0, 1, 0, 1, 2], [2, 0, 1, 0, 1]])
    tfidf = layers.StringLookup(output_mode="tf_idf")
    tfidf.set_vocabulary(VOCAB, idf_weights=[0.25, 0.75, 0.6, 0.4])
    np.testing.assert_allclose(np.asarray(tfidf(DATA4)), [[0, 0.25, 0, 0.6, 0.8], [1.0, 0, 0.75, 0, 0.4]], rtol=1e-6)
    tfidf.set_vocabulary(["[UNK]"] + VOCAB, idf_weights=[0.9, 0.25, 0.75, 0.6, 0.4])
    np.testing.assert_allclose(np.asarray(tfidf(DATA4)), [[0, 0.25, 0, 0.6, 0.8], [1.8, 0, 0.75, 0, 0.4]], rtol=1e-6)
    inverse = layers.StringLookup(vocabulary=VOCAB, invert=True)
    expected = np.array([[b"a", b"c", b"d"], [b"d", b"[UNK]", b"b"]], dtype=object)
    np.testing.assert_array_equal(inverse([[1, 3, 4], [4, 0, 2]]), expected)
    np.testing.assert_array_equal(inverse(layers.StringLookup(vocabulary=VOCAB)(DATA)), expected)


def test_integer_lookup_matches_keras_docs():
    np.testing.assert_array_equal(np.asarray(layers.IntegerLookup(vocabulary=IVOCAB)(IDATA)), [[1, 3, 4], [4, 0, 2]])
    layer = layers.IntegerLookup()
    layer.adapt(IDATA)
    assert layer.get_vocabulary() == [-1, 42, 1138, 1000, 36, 12]
    np.testing.assert_array_equal(np.asarray(layer(IDATA)), [[5, 2, 1], [1, 3, 4]])
    two = layers.IntegerLookup(vocabulary=IVOCAB, num_oov_indices=2)
    np.testing.assert_array_equal(np.asarray(two(np.array([[12, 1138, 42], [37, 1000, 36]]))), [[2, 4, 5], [1, 0, 3]])
    oov = np.array([100, 300, 700, 1100, 1700, 2000])
    floormod = layers.IntegerLookup(vocabulary=[10, 20, 30], num_oov_indices=4, oov_method="floormod")
    np.testing.assert_array_equal(np.asarray(floormod(oov)), [0, 0, 0, 0, 0, 0])
    farmhash = layers.IntegerLookup(vocabulary=[10, 20, 30], num_oov_indices=4, oov_method="farmhash")
    np.testing.assert_array_equal(np.asarray(farmhash(oov)), [3, 3, 2, 2, 0, 1])
    count = np.asarray(layers.IntegerLookup(vocabulary=IVOCAB, output_mode="count")(IDATA4))
    np.testing.assert_array_equal(count, [[0, 1, 0, 1, 2], [2, 0, 1, 0, 1]])
    tfidf = layers.IntegerLookup(output_mode="tf_idf", vocabulary=[-1] + IVOCAB, idf_weights=[0.9, 0.25, 0.75, 0.6, 0.4])
    np.testing.assert_allclose(np.asarray(tfidf(IDATA4)), [[0, 0.25, 0, 0.6, 0.8], [1.8, 0, 0.75, 0, 0.4]], rtol=1e-6)
    inverse = layers.IntegerLookup(vocabulary=IVOCAB, invert=True)
    np.testing.assert_array_equal(np.asarray(inverse(np.array([[1, 3, 4], [4, 0, 2]]))), [[12, 1138, 42], [42, -1, 36]])


def test_mask_token_and_adapt_limits():
    layer = layers.StringLookup(mask_token="", vocabulary=VOCAB)
    assert layer.get_vocabulary() == ["", "[UNK]", "a", "b", "c", "d"]
    np.testing.assert_array_equal(np.asarray(layer([["a", "", "z"]])), [[2, 0, 1]])
    multi = layers.StringLookup(mask_token="", vocabulary=VOCAB, output_mode="multi_hot")
    np.testing.assert_array_equal(np.asarray(multi([["a", "", "z"]])), [[1, 1, 0, 0, 0]])  # the mask counts nowhere
    small = layers.StringLookup(max_tokens=3)
    small.adapt(np.array(["x", "y", "y", "z", "z", "z", "[UNK]"]))
    assert small.get_vocabulary() == ["[UNK]", "z", "y"]
    assert small.vocabulary_size() == 3
    idf = layers.StringLookup(output_mode="tf_idf")
    idf.adapt([["a", "a", "b"], ["b", "c", "c"]])
    vocab = idf.get_vocabulary()
    weights = {t: np.log(1 + 2 / (1 + d)) for t, d in {"a": 1, "b": 2, "c": 1}.items()}
    expected = np.array([np.mean([weights[t] for t in vocab[1:]])] + [weights[t] for t in vocab[1:]])
    np.testing.assert_allclose(idf.idf_weights, expected, rtol=1e-6)
    out = np.asarray(idf([["a", "a", "q"]]))
    np.testing.assert_allclose(out[0, vocab.index("a")], 2 * weights["a"], rtol=1e-6)
    np.testing.assert_allclose(out[0, 0], expected[0], rtol=1e-6)


def test_configs_round_trip():
    for layer in (layers.StringLookup(vocabulary=VOCAB, num_oov_indices=2, mask_token="", name="s"),
                  layers.IntegerLookup(vocabulary=IVOCAB, output_mode="count", name="i")):
        config = layer.get_config()
        again = type(layer).from_config(json.loads(json.dumps(config)))
        assert again.get_vocabulary() == layer.get_vocabulary()
        sample = DATA if isinstance(layer, layers.StringLookup) else IDATA
        np.testing.assert_array_equal(np.asarray(again(sample)), np.asarray(layer(sample)))
    config = layers.StringLookup(vocabulary=VOCAB).get_config()
    for key in ("invert", "max_tokens", "num_oov_indices", "oov_token", "mask_token", "output_mode", "sparse",
                "pad_to_max_tokens", "vocabulary_dtype", "idf_weights", "vocabulary", "vocabulary_size", "oov_method",
                "salt", "encoding"):
        assert key in config, key


def test_errors_name_the_layer():
    with pytest.raises(ValueError, match=r"StringLookup 'q': The passed vocabulary has at least one repeated term"):
        layers.StringLookup(vocabulary=["a", "a"], name="q")
    with pytest.raises(ValueError, match=r"`output_mode` must be `'int'` when `invert` is true"):
        layers.StringLookup(invert=True, output_mode="count")
    with pytest.raises(ValueError, match=r"When `num_oov_indices=0` all inputs should be in vocabulary"):
        layers.StringLookup(vocabulary=VOCAB, num_oov_indices=0)(["z"])
    with pytest.raises(RuntimeError, match=r"you must set the layer's vocabulary before calling it"):
        layers.IntegerLookup(output_mode="multi_hot")(IDATA)
    with pytest.raises(ValueError, match=r"Cannot adapt layer"):
        layers.IntegerLookup(vocabulary=IVOCAB).adapt(IDATA)
    with pytest.raises(ValueError, match=r"larger than the maximum vocab size"):
        layers.StringLookup(max_tokens=3, vocabulary=VOCAB)
    with pytest.raises(TypeError, match=r"tokens must be integers"):
        layers.IntegerLookup(vocabulary=IVOCAB)(np.array(["x"]))


# ----- TextVectorization ------------------------------------------------------------------------------------
def test_text_vectorization_matches_keras_docs():
    layer = layers.TextVectorization(max_tokens=5000, output_mode="int", output_sequence_length=4)
    layer.adapt(["foo bar", "bar baz", "baz bada boom"])
    np.testing.assert_array_equal(np.asarray(layer([["foo qux bar"], ["qux baz"]])), [[4, 1, 3, 0], [1, 2, 0, 0]])
    given = layers.TextVectorization(max_tokens=5000, output_sequence_length=4,
                                     vocabulary=["earth", "wind", "and", "fire"])
    assert given.get_vocabulary() == ["", "[UNK]", "earth", "wind", "and", "fire"]


def test_text_vectorization_standardize_split_ngrams_and_modes():
    layer = layers.TextVectorization(vocabulary=["hello", "world", "it's"])
    # ASCII lower-casing (as tf.strings.lower), Keras's punctuation stripped (the apostrophe too)
    np.testing.assert_array_equal(np.asarray(layer(["HeLLo,   World!", "its ÉTÉ"])), [[2, 3], [1, 1]])
    chars = layers.TextVectorization(split="character", standardize=None, vocabulary=["a", "b"])
    np.testing.assert_array_equal(np.asarray(chars(["abca"])), [[2, 3, 1, 2]])
    grams = layers.TextVectorization(ngrams=(1, 3), output_mode="count", standardize="lower")
    grams.adapt(["a b c d", "a b"])
    vocab = grams.get_vocabulary()
    assert vocab[0] == "[UNK]" and "a b c" in vocab and "a b" not in vocab  # widths 1 and 3 only
    out = np.asarray(grams(["a b c", "z"]))
    assert out.shape == (2, len(vocab))
    assert out[0, vocab.index("a b c")] == 1 and out[0, vocab.index("a")] == 1 and out[1, 0] == 1
    tfidf = layers.TextVectorization(output_mode="tf_idf")
    tfidf.adapt(["x x y", "y z"])
    assert tfidf.get_vocabulary() == ["[UNK]", "y", "x", "z"]  # x and y both twice: the tie goes high to low
    idf = {"x": np.log(1 + 2 / 2), "y": np.log(1 + 2 / 3), "z": np.log(1 + 2 / 2)}
    np.testing.assert_allclose(np.asarray(tfidf(["x x q"]))[0],
                               [np.mean(list(idf.values())), 0, 2 * idf["x"], 0], rtol=1e-6)
    ragged = layers.TextVectorization(ragged=True, vocabulary=["a", "b"])(["a b a", "b"])
    assert [r.tolist() for r in ragged] == [[2, 3, 2], [3]]
    cut = layers.TextVectorization(vocabulary=["a", "b"], output_sequence_length=2)
    np.testing.assert_array_equal(np.asarray(cut(["a b a b", "b"])), [[2, 3], [3, 0]])


def test_text_vectorization_adapt_order_and_config():
    layer = layers.TextVectorization(max_tokens=4)
    layer.adapt(["b b a", "c a d", "b"])
    assert layer.get_vocabulary() == ["", "[UNK]", "b", "a"]  # max_tokens counts the two special tokens
    config = layer.get_config()
    assert config["vocabulary_size"] == 4 and config["standardize"] == "lower_and_strip_punctuation"
    json.dumps(config)
    again = layers.TextVectorization.from_config(config)
    assert again.get_config()["ngrams"] is None
    with pytest.raises(ValueError, match=r"TextVectorization 't': `output_sequence_length` must not be set"):
        layers.TextVectorization(output_mode="count", output_sequence_length=3, name="t")
    with pytest.raises(ValueError, match=r"the input rank must be 1 or the last shape dimension must be 1"):
        layers.TextVectorization(vocabulary=["a"])(np.array([["a", "b"]]))
