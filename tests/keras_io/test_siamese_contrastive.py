"""Image similarity estimation using a Siamese Network with a contrastive loss

Source: keras-io examples/vision/siamese_contrastive.py (the version of 2026/01/28: the distance is the
model's output, with an ``accuracy`` metric function)

Changes:
- Data: seeded NumPy stand-ins of MNIST's shape (28x28 float32 in [0, 255], labels 0..9), made learnable
  (each class draws its own horizontal and vertical bar, plus noise), instead of
  ``keras.datasets.mnist``; ``make_pairs`` runs as published on them (Python's ``random`` seeded).
- Sizes: 160 / 64 / 64 images (320 / 128 / 128 pairs) for train / validation / test instead of
  30,000 / 30,000 / 10,000, and 4 epochs instead of 10 (``batch_size`` 16 and ``margin`` 1 as published).
- The plots (``visualize``, ``plt_metric``) are left out; the test asserts what they show instead: the
  contrastive loss falls, the ``accuracy`` metric function (wrapped as Keras 3 wraps a plain function)
  beats chance on the test pairs, and ``predict`` gives one distance per pair.
"""

import random

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops
from testutil import bar_digits

SOURCE = "examples/vision/siamese_contrastive.py"
UNCHANGED = True


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def make_pairs(x, y):
    """Creates a tuple containing image pairs with corresponding label.

    Arguments:
        x: List containing images, each index in this list corresponds to one image.
        y: List containing labels, each label with datatype of `int`.

    Returns:
        Tuple containing two numpy arrays as (pairs_of_samples, labels),
        where pairs_of_samples' shape is (2len(x), 2,n_features_dims) and
        labels are a binary array of shape (2len(x)).
    """

    num_classes = max(y) + 1
    digit_indices = [np.where(y == i)[0] for i in range(num_classes)]

    pairs = []
    labels = []

    for idx1 in range(len(x)):
        # add a matching example
        x1 = x[idx1]
        label1 = y[idx1]
        idx2 = random.choice(digit_indices[label1])
        x2 = x[idx2]

        pairs += [[x1, x2]]
        labels += [0]

        # add a non-matching example
        label2 = random.randint(0, num_classes - 1)
        while label2 == label1:
            label2 = random.randint(0, num_classes - 1)

        idx2 = random.choice(digit_indices[label2])
        x2 = x[idx2]

        pairs += [[x1, x2]]
        labels += [1]

    return np.array(pairs), np.array(labels).astype("float32")


# Provided two tensors t1 and t2
# Euclidean distance = sqrt(sum(square(t1-t2)))
def euclidean_distance(vects):
    """Find the Euclidean distance between two vectors.

    Arguments:
        vects: List containing two tensors of same length.

    Returns:
        Tensor containing euclidean distance
        (as floating point value) between vectors.
    """
    x, y = vects
    sum_square = ops.sum(ops.square(x - y), axis=1, keepdims=True)
    return ops.sqrt(ops.maximum(sum_square, keras.backend.epsilon()))


def create_embedding_network():
    """Creates a convolutional neural network for image embedding.

    The network takes a grayscale image as input and outputs a 10-dimensional
    latent representation (embedding). It uses a series of Conv2D and
    AveragePooling2D layers to extract features, followed by a Dense layer
    with tanh activation.

    Returns:
        keras.Model: A Functional API model instance mapping (28, 28, 1) images
            to 10D embedding vectors.
    """
    inputs = layers.Input((28, 28, 1))
    x = layers.BatchNormalization()(inputs)
    x = layers.Conv2D(4, (5, 5), activation="tanh")(x)
    x = layers.AveragePooling2D(pool_size=(2, 2))(x)
    x = layers.Conv2D(16, (5, 5), activation="tanh")(x)
    x = layers.AveragePooling2D(pool_size=(2, 2))(x)
    x = layers.Flatten()(x)
    x = layers.BatchNormalization()(x)
    x = layers.Dense(10, activation="tanh")(x)
    return keras.Model(inputs, x, name="embedding")


def loss(margin=1):
    """Provides 'contrastive_loss' an enclosing scope with variable 'margin'.

    Arguments:
        margin: Integer, defines the baseline for distance for which pairs
                should be classified as dissimilar. - (default is 1).

    Returns:
        'contrastive_loss' function with data ('margin') attached.
    """

    # Contrastive loss = mean( (1-true_value) * square(prediction) +
    #                         true_value * square( max(margin-prediction, 0) ))
    def contrastive_loss(y_true, y_pred):
        """Calculates the contrastive loss.

        Arguments:
            y_true: List of labels, each label is of type float32.
            y_pred: List of predictions of same length as of y_true,
                    each label is of type float32.

        Returns:
            A tensor containing contrastive loss as floating point value.
        """

        square_pred = ops.square(y_pred)
        margin_square = ops.square(ops.maximum(margin - (y_pred), 0))
        return ops.mean((1 - y_true) * square_pred + (y_true) * margin_square)

    return contrastive_loss


def accuracy(y_true, y_pred):
    """Computes the accuracy of the predictions.

    Arguments:
        y_true: List of labels, each label is of type float32.
        y_pred: List of predictions of same length as of y_true,
                each label is of type float32.

    Returns:
        A tensor containing accuracy as floating point value.
    """
    y_true = ops.cast(y_true, "float32")

    y_true = ops.reshape(y_true, [-1])
    y_pred = ops.reshape(y_pred, [-1])

    # 0 for similar (<0.5), 1 for dissimilar (>0.5)
    preds = ops.cast(y_pred > 0.5, "float32")
    return ops.mean(ops.equal(y_true, preds))


def test_siamese_contrastive():
    keras.utils.set_random_seed(0)
    random.seed(0)
    rng = np.random.default_rng(0)

    epochs = 4
    batch_size = 16
    margin = 1  # Margin for contrastive loss.

    (x_train_val, y_train_val), (x_test, y_test) = bar_digits(224, rng), bar_digits(64, rng)

    # Change the data type to a floating point format
    x_train_val = x_train_val.astype("float32")
    x_test = x_test.astype("float32")

    # Keep part of train_val in validation set
    x_train, x_val = x_train_val[:160], x_train_val[160:]
    y_train, y_val = y_train_val[:160], y_train_val[160:]
    del x_train_val, y_train_val

    # make train pairs
    pairs_train, labels_train = make_pairs(x_train, y_train)

    # make validation pairs
    pairs_val, labels_val = make_pairs(x_val, y_val)

    # make test pairs
    pairs_test, labels_test = make_pairs(x_test, y_test)
    assert pairs_train.shape == (320, 2, 28, 28)

    x_train_1 = pairs_train[:, 0]  # x_train_1.shape is (320, 28, 28)
    x_train_2 = pairs_train[:, 1]
    x_val_1 = pairs_val[:, 0]
    x_val_2 = pairs_val[:, 1]
    x_test_1 = pairs_test[:, 0]
    x_test_2 = pairs_test[:, 1]

    embedding_network = create_embedding_network()

    input_1 = layers.Input((28, 28, 1))
    input_2 = layers.Input((28, 28, 1))

    # As mentioned above, Siamese Network share weights between
    # tower networks (sister networks). To allow this, we will use
    # same embedding network for both tower networks.
    tower_1 = embedding_network(input_1)
    tower_2 = embedding_network(input_2)

    # Distance is the output, remove the final Dense Sigmoid layer
    distance = layers.Lambda(euclidean_distance)([tower_1, tower_2])
    siamese = keras.Model(inputs=[input_1, input_2], outputs=distance)

    siamese.compile(loss=loss(margin=margin), optimizer="RMSprop", metrics=[accuracy])
    siamese.summary()
    # the published summary: 5,318 parameters (4,804 trainable, 514 non-trainable: the batch norms' statistics)
    assert siamese.count_params() == 5318
    assert sum(int(np.prod(w.shape)) for w in siamese.trainable_weights) == 4804
    assert len(siamese.layers) == 4  # two inputs, the shared embedding model, the Lambda

    history = siamese.fit(
        [x_train_1, x_train_2],
        labels_train,
        validation_data=([x_val_1, x_val_2], labels_val),
        batch_size=batch_size,
        epochs=epochs,
        verbose=0,
    )

    hist = history.history
    assert set(hist) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert np.all(np.isfinite(hist["loss"])) and hist["loss"][-1] < hist["loss"][0], hist["loss"]

    results = siamese.evaluate([x_test_1, x_test_2], labels_test, verbose=0)
    test_loss, test_acc = results
    assert test_acc > 0.6, results  # chance is 0.5

    predictions = siamese.predict([x_test_1, x_test_2], verbose=0)
    assert predictions.shape == (128, 1) and np.all(predictions > 0)
    # the metric function, averaged over the test batches as Keras's MeanMetricWrapper does
    per_batch = [np.mean((predictions[i:i + 32, 0] > 0.5) == labels_test[i:i + 32]) for i in range(0, 128, 32)]
    np.testing.assert_allclose(test_acc, np.mean(per_batch), atol=1e-6)
    # one embedding network, applied to both inputs: the towers agree on identical images
    same = siamese.predict([x_test_1[:4], x_test_1[:4]], verbose=0)
    np.testing.assert_allclose(same, np.sqrt(keras.backend.epsilon()), rtol=1e-3)
