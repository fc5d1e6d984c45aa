"""Text generation with a miniature GPT

Source: keras-io examples/generative/text_generation_with_miniature_gpt.py

Changes:
- Data: real English text that ships with Python (CPython's pydoc topic help, ``pydoc_data.topics``,
  tests/keras_io/realtext.py) instead of the IMDB reviews download, tokenized in plain Python as the
  example's ``custom_standardization`` + ``TextVectorization`` do (lowercase, punctuation split off, the
  vocabulary by frequency with "" and "[UNK]" first); no tf.data (NumPy arrays and ``batch_size``).
- Sizes: vocabulary 1,000 instead of 20,000, maxlen 32 instead of 80, embed_dim 64 and feed_forward_dim 64
  instead of 256, 1,024 training sequences, 3 epochs instead of 25. ``verbose=0``.
- The TextGenerator callback runs once, at the end, for 8 tokens; its output is checked, not printed.
- Checks added: the loss falls below the unigram entropy of the training targets (the model learned
  context, not only word frequencies) and the causal mask holds (a later token does not change an earlier
  position's logits).
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops
from realtext import encode, topics, vocabulary, words

UNCHANGED = False
CHANGES = ("real offline text stands in for the IMDB download (pydoc topic help) with the tokenization written "
           "in Python instead of TextVectorization and tf.data; sizes reduced; the generation callback runs "
           "once; no dnnbind gap")
SOURCE = "examples/generative/text_generation_with_miniature_gpt.py"


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def causal_attention_mask(batch_size, n_dest, n_src, dtype):
    """
    Mask the upper half of the dot product matrix in self attention.
    This prevents flow of information from future tokens to current token.
    1's in the lower triangle, counting from the lower right corner.
    """
    i = ops.arange(n_dest)[:, None]
    j = ops.arange(n_src)
    m = i >= j - n_src + n_dest
    mask = ops.cast(m, dtype)
    mask = ops.reshape(mask, [1, n_dest, n_src])
    mult = ops.concatenate([ops.expand_dims(batch_size, -1), ops.convert_to_tensor([1, 1])], 0)
    return ops.tile(mask, mult)


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads, embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        input_shape = ops.shape(inputs)
        batch_size = input_shape[0]
        seq_len = input_shape[1]
        causal_mask = causal_attention_mask(batch_size, seq_len, seq_len, "bool")
        attention_output = self.att(inputs, inputs, attention_mask=causal_mask)
        attention_output = self.dropout1(attention_output)
        out1 = self.layernorm1(inputs + attention_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(0, maxlen, 1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


vocab_size = 1000
maxlen = 32
embed_dim = 64
num_heads = 2
feed_forward_dim = 64


def create_model():
    inputs = layers.Input(shape=(maxlen,), dtype="int32")
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, feed_forward_dim)
    x = transformer_block(x)
    outputs = layers.Dense(vocab_size)(x)
    model = keras.Model(inputs=inputs, outputs=[outputs, x])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(
        "adam", loss=[loss_fn, None],
    )  # No loss and optimization based on word embeddings from transformer block
    return model


class TextGenerator(keras.callbacks.Callback):
    """Feed a prompt, take the top-k next-token distribution, sample, append (the example's callback)."""

    def __init__(self, max_tokens, start_tokens, index_to_word, top_k=10, print_every=1):
        self.max_tokens = max_tokens
        self.start_tokens = start_tokens
        self.index_to_word = index_to_word
        self.print_every = print_every
        self.k = top_k
        self.generated = []

    def sample_from(self, logits):
        logits, indices = ops.top_k(logits, k=self.k, sorted=True)
        indices = np.asarray(indices).astype("int32")
        preds = keras.activations.softmax(ops.expand_dims(logits, 0))[0]
        preds = np.asarray(preds).astype("float32")
        preds = preds / preds.sum()
        return np.random.choice(indices, p=preds)

    def detokenize(self, number):
        return self.index_to_word[number]

    def on_epoch_end(self, epoch, logs=None):
        start_tokens = [_ for _ in self.start_tokens]
        if (epoch + 1) % self.print_every != 0:
            return
        num_tokens_generated = 0
        tokens_generated = []
        while num_tokens_generated <= self.max_tokens:
            pad_len = maxlen - len(start_tokens)
            sample_index = len(start_tokens) - 1
            if pad_len < 0:
                x = start_tokens[:maxlen]
                sample_index = maxlen - 1
            elif pad_len > 0:
                x = start_tokens + [0] * pad_len
            else:
                x = start_tokens
            x = np.array([x])
            y, _ = self.model.predict(x, verbose=0)
            sample_token = self.sample_from(y[0][sample_index])
            tokens_generated.append(sample_token)
            start_tokens.append(sample_token)
            num_tokens_generated = len(tokens_generated)
        self.generated = [self.detokenize(_) for _ in self.start_tokens + tokens_generated]


def test_text_generation_with_miniature_gpt():
    keras.utils.set_random_seed(3)
    np.random.seed(3)
    tokens = words(" ".join(topics().values()))
    vocab = vocabulary(tokens, vocab_size)
    ids = encode(tokens, vocab)
    n = 1024
    starts = np.random.default_rng(0).choice(len(ids) - maxlen - 1, size=n, replace=False)
    seqs = np.stack([ids[s:s + maxlen + 1] for s in starts])
    x, y = seqs[:, :-1], seqs[:, 1:]

    word_to_index = {word: index for index, word in enumerate(vocab)}
    start_prompt = "the object is"
    start_tokens = [word_to_index.get(_, 1) for _ in start_prompt.split()]
    text_gen_callback = TextGenerator(8, start_tokens, vocab, print_every=3)

    model = create_model()
    history = model.fit(x, y, batch_size=32, verbose=0, epochs=3, callbacks=[text_gen_callback])
    losses = history.history["loss"]

    counts = np.bincount(y.reshape(-1), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    unigram_entropy = float(-(p * np.log(p)).sum())
    assert losses[-1] < losses[0] and losses[-1] < unigram_entropy - 0.3, (losses, unigram_entropy)

    assert len(text_gen_callback.generated) == 3 + 9 and all(w in vocab for w in text_gen_callback.generated)

    # causality: changing the last token leaves every earlier position's logits unchanged
    probe = x[:2].copy()
    a, _ = model.predict(probe, verbose=0)
    probe[:, -1] = (probe[:, -1] + 7) % vocab_size
    b, _ = model.predict(probe, verbose=0)
    np.testing.assert_allclose(a[:, :-1], b[:, :-1], rtol=1e-5, atol=1e-5)
    assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-4
