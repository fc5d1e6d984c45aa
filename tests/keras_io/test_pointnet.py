"""Point cloud classification with PointNet

Source: keras-io examples/vision/pointnet.py (the Keras 3 version of 2024/01/09)

Changes:
- Data: seeded synthetic point clouds instead of ModelNet10 meshes sampled with ``trimesh``: each of the
  10 classes is a box of its own half-extents (points drawn uniformly inside it), so the classes differ
  by their extents as ModelNet's objects differ by their shapes; ``CLASS_MAP`` names them.
- Sizes: ``NUM_POINTS`` 32 instead of 2048, 80 training clouds (80% of them trained on, 20% validating,
  as published) and 32 test clouds, 4 epochs instead of 20 (``BATCH_SIZE`` 32 and the network's widths
  as published).
- ``tf.data``: the published pipeline (``shuffle``, ``map(augment)``, ``take``/``skip``, ``batch``) is
  written with NumPy: the training clouds are shuffled, ``augment`` (as published: jitter and shuffle
  the points with ``keras.random``) is applied to each cloud, the first 80% train and the rest
  validate, and ``fit`` batches the arrays itself (``batch_size=BATCH_SIZE``).
- The mesh display and the matplotlib plots are left out; the test asserts what they show instead: the
  predictions on 8 test clouds (class names via ``CLASS_MAP``), plus the loss falling and the accuracy
  beating chance.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops

SOURCE = "examples/vision/pointnet.py"
UNCHANGED = False
CHANGES = ("the tf.data pipeline (shuffle, map(augment), take/skip, batch) is written with NumPy arrays and "
           "fit(batch_size=BATCH_SIZE), augment applied per cloud as published; no dnnbind gap")

NUM_POINTS = 32
NUM_CLASSES = 10
BATCH_SIZE = 32


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def parse_dataset(num_points=2048, rng=None):
    """Stand-in of the example's ModelNet10 parser: boxes of 10 class-specific half-extents."""
    extents = np.array([[a, b, c] for a, b, c in [(1, 1, 1), (1, 0.2, 0.2), (0.2, 1, 0.2), (0.2, 0.2, 1),
                                                   (1, 1, 0.2), (1, 0.2, 1), (0.2, 1, 1), (0.5, 0.5, 0.5),
                                                   (1, 0.5, 0.2), (0.2, 0.5, 1)]], np.float64)
    class_map = {i: f"box_{i}" for i in range(NUM_CLASSES)}

    def clouds(n):
        labels = rng.integers(0, NUM_CLASSES, n)
        points = rng.uniform(-1, 1, (n, num_points, 3)) * extents[labels][:, None, :]
        return points, labels

    train_points, train_labels = clouds(80)
    test_points, test_labels = clouds(32)
    return train_points, test_points, train_labels, test_labels, class_map


def augment(points, label):
    # jitter points
    points += keras.random.uniform(points.shape, -0.005, 0.005, dtype="float64")
    # shuffle points
    points = keras.random.shuffle(points)
    return points, label


def conv_bn(x, filters):
    x = layers.Conv1D(filters, kernel_size=1, padding="valid")(x)
    x = layers.BatchNormalization(momentum=0.0)(x)
    return layers.Activation("relu")(x)


def dense_bn(x, filters):
    x = layers.Dense(filters)(x)
    x = layers.BatchNormalization(momentum=0.0)(x)
    return layers.Activation("relu")(x)


class OrthogonalRegularizer(keras.regularizers.Regularizer):
    def __init__(self, num_features, l2reg=0.001):
        self.num_features = num_features
        self.l2reg = l2reg
        self.eye = ops.eye(num_features)

    def __call__(self, x):
        x = ops.reshape(x, (-1, self.num_features, self.num_features))
        xxt = ops.tensordot(x, x, axes=(2, 2))
        xxt = ops.reshape(xxt, (-1, self.num_features, self.num_features))
        return ops.sum(self.l2reg * ops.square(xxt - self.eye))


def tnet(inputs, num_features):
    # Initalise bias as the indentity matrix
    bias = keras.initializers.Constant(np.eye(num_features).flatten())
    reg = OrthogonalRegularizer(num_features)

    x = conv_bn(inputs, 32)
    x = conv_bn(x, 64)
    x = conv_bn(x, 512)
    x = layers.GlobalMaxPooling1D()(x)
    x = dense_bn(x, 256)
    x = dense_bn(x, 128)
    x = layers.Dense(
        num_features * num_features,
        kernel_initializer="zeros",
        bias_initializer=bias,
        activity_regularizer=reg,
    )(x)
    feat_T = layers.Reshape((num_features, num_features))(x)
    # Apply affine transformation to input features
    return layers.Dot(axes=(2, 1))([inputs, feat_T])


def test_pointnet():
    keras.utils.set_random_seed(seed=42)
    rng = np.random.default_rng(42)

    train_points, test_points, train_labels, test_labels, CLASS_MAP = parse_dataset(NUM_POINTS, rng)

    # the tf.data pipeline: shuffle, map(augment), take 80% to train and the rest to validate
    train_size = 0.8
    order = rng.permutation(len(train_points))
    augmented = [augment(train_points[i], train_labels[i]) for i in order]
    points = np.stack([ops.convert_to_numpy(p) for p, _ in augmented])
    labels = np.array([label for _, label in augmented])
    train_dataset_size = int(len(points) * train_size)
    assert points.shape == (80, NUM_POINTS, 3) and points.dtype == np.float64
    assert not np.allclose(points[0], train_points[order[0]])  # jittered and shuffled
    np.testing.assert_allclose(np.sort(points[0], axis=0), np.sort(train_points[order[0]], axis=0), atol=0.006)

    inputs = keras.Input(shape=(NUM_POINTS, 3))

    x = tnet(inputs, 3)
    x = conv_bn(x, 32)
    x = conv_bn(x, 32)
    x = tnet(x, 32)
    x = conv_bn(x, 32)
    x = conv_bn(x, 64)
    x = conv_bn(x, 512)
    x = layers.GlobalMaxPooling1D()(x)
    x = dense_bn(x, 256)
    x = layers.Dropout(0.3)(x)
    x = dense_bn(x, 128)
    x = layers.Dropout(0.3)(x)

    outputs = layers.Dense(NUM_CLASSES, activation="softmax")(x)

    model = keras.Model(inputs=inputs, outputs=outputs, name="pointnet")
    model.summary()
    # the published summary: 748,979 parameters (742,899 trainable); the point count does not change them
    assert model.count_params() == 748979
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == 742899

    # at initialisation each T-net is the identity (zero kernel, identity bias): Dot(axes=(2, 1)) gives x @ I
    dots = [layer for layer in model.layers if isinstance(layer, layers.Dot)]
    assert len(dots) == 2
    first = next(d for d in dots if d.output.shape == (None, NUM_POINTS, 3))  # the input T-net's
    tnet_out = keras.Model(inputs, first.output)
    probe = points[:2].astype("float32")
    np.testing.assert_allclose(tnet_out.predict(probe, verbose=0), probe, rtol=1e-6, atol=1e-6)

    model.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(learning_rate=0.001),
        metrics=["sparse_categorical_accuracy"],
    )

    history = model.fit(
        points[:train_dataset_size],
        labels[:train_dataset_size],
        batch_size=BATCH_SIZE,
        epochs=4,
        validation_data=(points[train_dataset_size:], labels[train_dataset_size:]),
        verbose=0,
    )
    loss = history.history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], loss
    assert set(history.history) == {"loss", "sparse_categorical_accuracy", "val_loss",
                                    "val_sparse_categorical_accuracy"}
    # an eager training call records the orthogonality regularizers of both T-nets (Keras 3's model.losses)
    model(points[:4].astype("float32"), training=True)
    assert len(model.losses) == 2 and all(float(ops.convert_to_numpy(v)) >= 0 for v in model.losses)

    # Visualize predictions: run test data through model
    points_8 = test_points[:8, ...]
    labels_8 = test_labels[:8, ...]
    preds = model.predict(points_8, verbose=0)
    preds = ops.argmax(preds, -1)
    names = [(CLASS_MAP[int(p)], CLASS_MAP[int(t)]) for p, t in zip(ops.convert_to_numpy(preds), labels_8)]
    assert len(names) == 8 and all(n.startswith("box_") for pair in names for n in pair)

    _, test_acc = model.evaluate(test_points, test_labels, verbose=0)
    assert test_acc > 0.2, test_acc  # chance is 0.1
