"""Collaborative Filtering for Movie Recommendations

Source: keras-io examples/structured_data/collaborative_filtering_movielens.py

Changes:
- Data: a seeded NumPy stand-in of MovieLens' ratings table (user ids, movie ids, ratings 0.5-5.0 in half
  steps, from a hidden user bias + movie bias + low-rank taste) instead of the downloaded ``ratings.csv``;
  the id encoding and the [0, 1] scaling of the ratings follow the example, with NumPy instead of pandas.
  The recommendation step takes a user's unrated movies from the same table (no ``movies.csv`` titles).
- Sizes: 80 users, 120 movies, 3000 ratings (the real table has 610 / 9724 / 100836); 3 epochs instead of
  5 (batch size 64 as published). ``verbose=0``.
- The plot (matplotlib) is left out.
- The model code is as published, including ``ops.tensordot(user_vector, movie_vector, 2)``, which sums
  over the batch too (one scalar added to every sample's score): the test keeps that behaviour.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "examples/structured_data/collaborative_filtering_movielens.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


EMBEDDING_SIZE = 50


class RecommenderNet(keras.Model):
    def __init__(self, num_users, num_movies, embedding_size, **kwargs):
        super().__init__(**kwargs)
        self.num_users = num_users
        self.num_movies = num_movies
        self.embedding_size = embedding_size
        self.user_embedding = layers.Embedding(
            num_users,
            embedding_size,
            embeddings_initializer="he_normal",
            embeddings_regularizer=keras.regularizers.l2(1e-6),
        )
        self.user_bias = layers.Embedding(num_users, 1)
        self.movie_embedding = layers.Embedding(
            num_movies,
            embedding_size,
            embeddings_initializer="he_normal",
            embeddings_regularizer=keras.regularizers.l2(1e-6),
        )
        self.movie_bias = layers.Embedding(num_movies, 1)

    def call(self, inputs):
        user_vector = self.user_embedding(inputs[:, 0])
        user_bias = self.user_bias(inputs[:, 0])
        movie_vector = self.movie_embedding(inputs[:, 1])
        movie_bias = self.movie_bias(inputs[:, 1])
        dot_user_movie = ops.tensordot(user_vector, movie_vector, 2)
        # Add all the components (including bias)
        x = dot_user_movie + user_bias + movie_bias
        # The sigmoid activation forces the rating to between 0 and 1
        return ops.nn.sigmoid(x)


def _ratings_table(rng, n_users=80, n_movies=120, n_ratings=3000):
    """(userId, movieId, rating) rows with non-sequential ids, as in MovieLens."""
    user_ids = rng.choice(np.arange(1, 1000), n_users, replace=False)
    movie_ids = rng.choice(np.arange(1, 200000), n_movies, replace=False)
    ub, mb = rng.normal(0, 1.0, n_users), rng.normal(0, 1.0, n_movies)
    pairs = rng.choice(n_users * n_movies, n_ratings, replace=False)
    u, m = pairs // n_movies, pairs % n_movies
    score = 3.0 + ub[u] + mb[m] + 0.3 * rng.normal(size=n_ratings)
    rating = np.clip(np.round(score * 2) / 2, 0.5, 5.0).astype(np.float32)
    return user_ids[u], movie_ids[m], rating


def test_collaborative_filtering_movielens():
    rng = np.random.default_rng(3)
    keras.utils.set_random_seed(3)
    user_col, movie_col, rating_col = _ratings_table(rng)

    user_ids = list(dict.fromkeys(user_col.tolist()))  # df["userId"].unique().tolist()
    user2user_encoded = {x: i for i, x in enumerate(user_ids)}
    movie_ids = list(dict.fromkeys(movie_col.tolist()))
    movie2movie_encoded = {x: i for i, x in enumerate(movie_ids)}
    movie_encoded2movie = {i: x for i, x in enumerate(movie_ids)}
    user = np.array([user2user_encoded[x] for x in user_col])
    movie = np.array([movie2movie_encoded[x] for x in movie_col])

    num_users = len(user2user_encoded)
    num_movies = len(movie_encoded2movie)
    min_rating = min(rating_col)
    max_rating = max(rating_col)

    order = rng.permutation(len(rating_col))  # df.sample(frac=1, random_state=42)
    x = np.stack([user, movie], axis=1)[order]
    y = ((rating_col - min_rating) / (max_rating - min_rating))[order]
    train_indices = int(0.9 * len(x))
    x_train, x_val, y_train, y_val = (
        x[:train_indices],
        x[train_indices:],
        y[:train_indices],
        y[train_indices:],
    )

    model = RecommenderNet(num_users, num_movies, EMBEDDING_SIZE)
    model.compile(
        loss=keras.losses.BinaryCrossentropy(),
        optimizer=keras.optimizers.Adam(learning_rate=0.001),
    )

    history = model.fit(
        x=x_train,
        y=y_train,
        batch_size=64,
        epochs=3,
        verbose=0,
        validation_data=(x_val, y_val),
    )

    losses, val_losses = history.history["loss"], history.history["val_loss"]
    assert np.all(np.isfinite(losses + val_losses))
    assert losses[-1] < losses[0] and val_losses[-1] < val_losses[0]
    # the L2 penalties of the two embedding tables are the model's losses
    assert len(model.losses) == 2
    assert [w.shape for w in model.user_embedding.weights] == [(num_users, EMBEDDING_SIZE)]

    # Show top 10 movie recommendations to a user
    user_id = user_col[0]
    watched = set(movie_col[user_col == user_id].tolist())
    movies_not_watched = [m for m in movie_ids if m not in watched]
    movies_not_watched = [[movie2movie_encoded.get(x)] for x in movies_not_watched]
    user_encoder = user2user_encoded.get(user_id)
    user_movie_array = np.hstack(
        ([[user_encoder]] * len(movies_not_watched), movies_not_watched)
    )
    ratings = model.predict(user_movie_array).flatten()
    top_ratings_indices = ratings.argsort()[-10:][::-1]
    recommended_movie_ids = [
        movie_encoded2movie.get(movies_not_watched[x][0])
        for x in top_ratings_indices
    ]
    assert ratings.shape == (len(movies_not_watched),) and np.all((ratings > 0) & (ratings < 1))
    assert len(set(recommended_movie_ids)) == 10 and not watched & set(recommended_movie_ids)
    # the movie-bias table has learned the hidden movie quality: recommended movies rate above average
    mean_rating = {m: rating_col[movie_col == m].mean() for m in movie_ids}
    assert np.mean([mean_rating[m] for m in recommended_movie_ids]) > rating_col.mean()
