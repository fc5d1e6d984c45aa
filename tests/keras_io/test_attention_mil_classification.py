"""Classification using Attention-based Deep Multiple Instance Learning (MIL).

Source: keras-io examples/vision/attention_mil_classification.py

Changes:
- Data: seeded NumPy stand-ins of MNIST's shape (28x28 uint8 digits, labels 0..9), made learnable (each
  class draws its own horizontal and vertical bar, plus noise), instead of ``keras.datasets.mnist``;
  ``create_bags`` runs as published on them (NumPy's global generator seeded).
- Sizes: ``BAG_COUNT`` 64 and ``VAL_BAG_COUNT`` 32 instead of 1000 and 300, and 3 epochs instead of 20
  (``BAG_SIZE`` 3, ``batch_size=1``, the class weights and both callbacks as published).
- The checkpoint goes to pytest's ``tmp_path`` instead of ``/tmp/best_model.weights.h5`` (``train`` takes
  the path, and returns the ``History`` with the model); ``predict`` also returns the loss and accuracy it
  prints, and passes ``verbose=0``.
- ``plot`` (which returns before drawing: ``return  ## TODO``), matplotlib's style and ``tqdm``'s
  progress bar over the models are left out; the test asserts what ``predict`` prints instead: the
  ensemble's loss and accuracy (above chance), and that the attention weights of each bag sum to 1.
"""

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind import ops
from testutil import bar_digits

SOURCE = "examples/vision/attention_mil_classification.py"
UNCHANGED = False
CHANGES = ("train() takes the checkpoint path (pytest's tmp_path, not /tmp) and also returns the History, predict() "
           "also returns the loss and accuracy it prints; plot (a stub in the example), matplotlib's style and tqdm "
           "are left out; no dnnbind gap")

POSITIVE_CLASS = 1
BAG_COUNT = 64
VAL_BAG_COUNT = 32
BAG_SIZE = 3
PLOT_SIZE = 3
ENSEMBLE_AVG_COUNT = 1


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def create_bags(input_data, input_labels, positive_class, bag_count, instance_count):
    # Set up bags.
    bags = []
    bag_labels = []

    # Normalize input data.
    input_data = np.divide(input_data, 255.0)

    # Count positive samples.
    count = 0

    for _ in range(bag_count):
        # Pick a fixed size random subset of samples.
        index = np.random.choice(input_data.shape[0], instance_count, replace=False)
        instances_data = input_data[index]
        instances_labels = input_labels[index]

        # By default, all bags are labeled as 0.
        bag_label = 0

        # Check if there is at least a positive class in the bag.
        if positive_class in instances_labels:
            # Positive bag will be labeled as 1.
            bag_label = 1
            count += 1

        bags.append(instances_data)
        bag_labels.append(np.array([bag_label]))

    print(f"Positive bags: {count}")
    print(f"Negative bags: {bag_count - count}")

    return (list(np.swapaxes(bags, 0, 1)), np.array(bag_labels))


class MILAttentionLayer(layers.Layer):
    """Implementation of the attention-based Deep MIL layer.

    Args:
      weight_params_dim: Positive Integer. Dimension of the weight matrix.
      kernel_initializer: Initializer for the `kernel` matrix.
      kernel_regularizer: Regularizer function applied to the `kernel` matrix.
      use_gated: Boolean, whether or not to use the gated mechanism.

    Returns:
      List of 2D tensors with BAG_SIZE length.
      The tensors are the attention scores after softmax with shape `(batch_size, 1)`.
    """

    def __init__(
        self,
        weight_params_dim,
        kernel_initializer="glorot_uniform",
        kernel_regularizer=None,
        use_gated=False,
        **kwargs,
    ):
        super().__init__(**kwargs)

        self.weight_params_dim = weight_params_dim
        self.use_gated = use_gated

        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

        self.v_init = self.kernel_initializer
        self.w_init = self.kernel_initializer
        self.u_init = self.kernel_initializer

        self.v_regularizer = self.kernel_regularizer
        self.w_regularizer = self.kernel_regularizer
        self.u_regularizer = self.kernel_regularizer

    def build(self, input_shape):
        # Input shape.
        # List of 2D tensors with shape: (batch_size, input_dim).
        input_dim = input_shape[0][1]

        self.v_weight_params = self.add_weight(
            shape=(input_dim, self.weight_params_dim),
            initializer=self.v_init,
            name="v",
            regularizer=self.v_regularizer,
            trainable=True,
        )

        self.w_weight_params = self.add_weight(
            shape=(self.weight_params_dim, 1),
            initializer=self.w_init,
            name="w",
            regularizer=self.w_regularizer,
            trainable=True,
        )

        if self.use_gated:
            self.u_weight_params = self.add_weight(
                shape=(input_dim, self.weight_params_dim),
                initializer=self.u_init,
                name="u",
                regularizer=self.u_regularizer,
                trainable=True,
            )
        else:
            self.u_weight_params = None

        self.input_built = True

    def call(self, inputs):
        # Assigning variables from the number of inputs.
        instances = [self.compute_attention_scores(instance) for instance in inputs]

        # Stack instances into a single tensor.
        instances = ops.stack(instances)

        # Apply softmax over instances such that the output summation is equal to 1.
        alpha = ops.softmax(instances, axis=0)

        # Split to recreate the same array of tensors we had as inputs.
        return [alpha[i] for i in range(alpha.shape[0])]

    def compute_attention_scores(self, instance):
        # Reserve in-case "gated mechanism" used.
        original_instance = instance

        # tanh(v*h_k^T)
        instance = ops.tanh(ops.tensordot(instance, self.v_weight_params, axes=1))

        # for learning non-linear relations efficiently.
        if self.use_gated:
            instance = instance * ops.sigmoid(
                ops.tensordot(original_instance, self.u_weight_params, axes=1)
            )

        # w^T*(tanh(v*h_k^T)) / w^T*(tanh(v*h_k^T)*sigmoid(u*h_k^T))
        return ops.tensordot(instance, self.w_weight_params, axes=1)


def create_model(instance_shape):
    # Extract features from inputs.
    inputs, embeddings = [], []
    shared_dense_layer_1 = layers.Dense(128, activation="relu")
    shared_dense_layer_2 = layers.Dense(64, activation="relu")
    for _ in range(BAG_SIZE):
        inp = layers.Input(instance_shape)
        flatten = layers.Flatten()(inp)
        dense_1 = shared_dense_layer_1(flatten)
        dense_2 = shared_dense_layer_2(dense_1)
        inputs.append(inp)
        embeddings.append(dense_2)

    # Invoke the attention layer.
    alpha = MILAttentionLayer(
        weight_params_dim=256,
        kernel_regularizer=keras.regularizers.L2(0.01),
        use_gated=True,
        name="alpha",
    )(embeddings)

    # Multiply attention weights with the input layers.
    multiply_layers = [
        layers.multiply([alpha[i], embeddings[i]]) for i in range(len(alpha))
    ]

    # Concatenate layers.
    concat = layers.concatenate(multiply_layers, axis=1)

    # Classification output node.
    output = layers.Dense(2, activation="softmax")(concat)

    return keras.Model(inputs, output)


def compute_class_weights(labels):
    # Count number of positive and negative bags.
    negative_count = len(np.where(labels == 0)[0])
    positive_count = len(np.where(labels == 1)[0])
    total_count = negative_count + positive_count

    # Build class weight dictionary.
    return {
        0: (1 / negative_count) * (total_count / 2),
        1: (1 / positive_count) * (total_count / 2),
    }


def train(train_data, train_labels, val_data, val_labels, model, file_path):
    # Initialize model checkpoint callback.
    model_checkpoint = keras.callbacks.ModelCheckpoint(
        file_path,
        monitor="val_loss",
        verbose=0,
        mode="min",
        save_best_only=True,
        save_weights_only=True,
    )

    # Initialize early stopping callback.
    # The model performance is monitored across the validation data and stops training
    # when the generalization error cease to decrease.
    early_stopping = keras.callbacks.EarlyStopping(
        monitor="val_loss", patience=10, mode="min"
    )

    # Compile model.
    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )

    # Fit model.
    history = model.fit(
        train_data,
        train_labels,
        validation_data=(val_data, val_labels),
        epochs=3,
        class_weight=compute_class_weights(train_labels),
        batch_size=1,
        callbacks=[early_stopping, model_checkpoint],
        verbose=0,
    )

    # Load best weights.
    model.load_weights(file_path)

    return model, history


def predict(data, labels, trained_models):
    # Collect info per model.
    models_predictions = []
    models_attention_weights = []
    models_losses = []
    models_accuracies = []

    for model in trained_models:
        # Predict output classes on data.
        predictions = model.predict(data, verbose=0)
        models_predictions.append(predictions)

        # Create intermediate model to get MIL attention layer weights.
        intermediate_model = keras.Model(model.input, model.get_layer("alpha").output)

        # Predict MIL attention layer weights.
        intermediate_predictions = intermediate_model.predict(data, verbose=0)

        attention_weights = np.squeeze(np.swapaxes(intermediate_predictions, 1, 0))
        models_attention_weights.append(attention_weights)

        loss, accuracy = model.evaluate(data, labels, verbose=0)
        models_losses.append(loss)
        models_accuracies.append(accuracy)

    print(
        f"The average loss and accuracy are {np.sum(models_losses, axis=0) / ENSEMBLE_AVG_COUNT:.2f}"
        f" and {100 * np.sum(models_accuracies, axis=0) / ENSEMBLE_AVG_COUNT:.2f} % resp."
    )

    return (
        np.sum(models_predictions, axis=0) / ENSEMBLE_AVG_COUNT,
        np.sum(models_attention_weights, axis=0) / ENSEMBLE_AVG_COUNT,
        np.sum(models_losses, axis=0) / ENSEMBLE_AVG_COUNT,
        np.sum(models_accuracies, axis=0) / ENSEMBLE_AVG_COUNT,
    )


def test_attention_mil_classification(tmp_path):
    keras.utils.set_random_seed(0)
    np.random.seed(0)
    rng = np.random.default_rng(0)
    (x_train, y_train), (x_val, y_val) = bar_digits(600, rng), bar_digits(200, rng)

    # Create training data.
    train_data, train_labels = create_bags(
        x_train, y_train, POSITIVE_CLASS, BAG_COUNT, BAG_SIZE
    )

    # Create validation data.
    val_data, val_labels = create_bags(
        x_val, y_val, POSITIVE_CLASS, VAL_BAG_COUNT, BAG_SIZE
    )
    assert len(train_data) == BAG_SIZE and train_data[0].shape == (BAG_COUNT, 28, 28)
    assert 0 < train_labels.sum() < BAG_COUNT  # both kinds of bag

    # Building model(s).
    instance_shape = train_data[0][0].shape
    models = [create_model(instance_shape) for _ in range(ENSEMBLE_AVG_COUNT)]

    # Show single model architecture.
    print(models[0].summary())
    # the published summary's parameter count: shared Dense 100,480 + 8,256, attention 2 * 16,384 + 256,
    # output Dense 386
    assert models[0].count_params() == 100480 + 8256 + 2 * 64 * 256 + 256 + 386

    # Training model(s).
    file_path = str(tmp_path / "best_model.weights.h5")
    trained = [train(train_data, train_labels, val_data, val_labels, model, file_path) for model in models]
    trained_models = [m for m, _ in trained]
    history = trained[0][1].history
    assert history["loss"][-1] < history["loss"][0], history["loss"]
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    # the attention layer's L2 regularizer is part of the loss
    assert len(trained_models[0].losses) == 3

    # Evaluate and predict classes and attention scores on validation data.
    class_predictions, attention_params, val_loss, val_acc = predict(val_data, val_labels, trained_models)

    assert class_predictions.shape == (VAL_BAG_COUNT, 2)
    np.testing.assert_allclose(class_predictions.sum(axis=1), 1.0, rtol=1e-5)
    assert attention_params.shape == (VAL_BAG_COUNT, BAG_SIZE)
    np.testing.assert_allclose(attention_params.sum(axis=1), 1.0, rtol=1e-5)  # the weights always sum to 1
    assert np.isfinite(val_loss)
    majority = max(val_labels.mean(), 1 - val_labels.mean())
    assert val_acc > majority, (val_acc, majority)  # better than always answering the commoner class
    # the best checkpoint was loaded: its validation loss is the best one seen
    np.testing.assert_allclose(val_loss, min(history["val_loss"]), rtol=1e-4)
