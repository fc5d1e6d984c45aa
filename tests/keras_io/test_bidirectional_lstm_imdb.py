"""Bidirectional LSTM on IMDB

Source: keras-io examples/nlp/bidirectional_lstm_imdb.py

Changes:
- Data: real English text that ships with Python (CPython's pydoc topic help, ``pydoc_data.topics``,
  tests/keras_io/realtext.py) instead of the IMDB download: a review stands in as a variable-length run of
  10-40 words from one of two topic families, the label says which (1: the data-model topics
  "specialnames", "customization", "attribute-access", "types"; 0: the statement topics "compound",
  "assignment", "exceptions", "execmodel"), encoded with a frequency vocabulary (0 padding, 1 unknown) as
  ``imdb.load_data(num_words=...)`` does, then ``pad_sequences(maxlen=...)`` (written out below: Keras's
  default pads and truncates at the front, "pre").
- Sizes: max_features 2,000 instead of 20,000, maxlen 40 instead of 200, Embedding 32 and LSTM 16 units
  instead of 128 and 64, 256 training / 128 validation reviews instead of 25,000 each, batch 32, 8 epochs instead of 2.
- A check added: validation accuracy above 75% (the two families use different words; chance is 50%).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from realtext import encode, topics, vocabulary, words

UNCHANGED = False
CHANGES = ("real offline text stands in for the IMDB download (pydoc topic help, two topic families as the two "
           "classes) and pad_sequences is written out; sizes reduced; no dnnbind gap")
SOURCE = "examples/nlp/bidirectional_lstm_imdb.py"


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


POSITIVE = ("specialnames", "customization", "attribute-access", "types")
NEGATIVE = ("compound", "assignment", "exceptions", "execmodel")


def pad_sequences(sequences, maxlen):
    """keras.utils.pad_sequences(sequences, maxlen) with its defaults: int32, padding and truncating "pre"."""
    out = np.zeros((len(sequences), maxlen), dtype=np.int32)
    for i, s in enumerate(sequences):
        s = s[-maxlen:]
        out[i, maxlen - len(s):] = s
    return out


def _reviews(n, vocab, rng):
    t = topics()
    pools = {1: words(" ".join(t[k] for k in POSITIVE)), 0: words(" ".join(t[k] for k in NEGATIVE))}
    xs, ys = [], []
    for _ in range(n):
        label = int(rng.integers(2))
        pool = pools[label]
        length = int(rng.integers(10, 41))
        start = int(rng.integers(len(pool) - length))
        xs.append(encode(pool[start:start + length], vocab))
        ys.append(label)
    return xs, np.array(ys)


def test_bidirectional_lstm_imdb():
    keras.utils.set_random_seed(4)
    max_features = 2000  # Only consider the top 2k words
    maxlen = 40  # Only consider the first 40 words of each review

    # Input for variable-length sequences of integers
    inputs = keras.Input(shape=(None,), dtype="int32")
    # Embed each integer in a 32-dimensional vector
    x = layers.Embedding(max_features, 32)(inputs)
    # Add 2 bidirectional LSTMs
    x = layers.Bidirectional(layers.LSTM(16, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(16))(x)
    # Add a classifier
    outputs = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, outputs)

    rng = np.random.default_rng(4)
    t = topics()
    vocab = vocabulary(words(" ".join(t[k] for k in POSITIVE + NEGATIVE)), max_features)
    x_train, y_train = _reviews(256, vocab, rng)
    x_val, y_val = _reviews(128, vocab, rng)
    x_train = pad_sequences(x_train, maxlen=maxlen)
    x_val = pad_sequences(x_val, maxlen=maxlen)

    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=32, epochs=8, validation_data=(x_val, y_val), verbose=0)
    assert history.history["val_accuracy"][-1] > 0.75, history.history
    assert history.history["loss"][-1] < history.history["loss"][0]
