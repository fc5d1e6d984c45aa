"""``keras.utils.image_dataset_from_directory`` / ``text_dataset_from_directory`` / ``audio_dataset_from_directory``.

The files are indexed as Keras indexes them (``labels="inferred"``: one class per sub-directory, in
alphanumeric order or ``class_names``' order, the files of each class sorted; a list of labels: the files of
the whole tree sorted; ``shuffle`` with NumPy's ``RandomState(seed)``; ``validation_split`` with ``subset``
``"training"``, ``"validation"`` or ``"both"`` taking the last ``int(split * n)`` files for validation). Keras
returns ``tf.data`` pipelines; dnnbind returns a :class:`DirectoryDataset` (a :class:`dnnbind.utils.PyDataset`
of NumPy batches, read from disk batch by batch) with ``class_names`` and ``file_paths``, which ``fit`` and a
``for`` loop take. Images need Pillow (``pip install 'dnnbind[images]'``); WAV files are read with the standard
library's ``wave``. The file order is shuffled once, when the dataset is made (Keras reshuffles every epoch).
"""

from __future__ import annotations

import os
import wave
from typing import Any, Callable, Sequence

import numpy as np

from .utils import PyDataset

__all__ = ["image_dataset_from_directory", "text_dataset_from_directory", "audio_dataset_from_directory",
           "DirectoryDataset", "index_directory"]

IMAGE_FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def _walk(directory: str, formats: Sequence[str], follow_links: bool) -> list[str]:
    found = []
    for root, _, files in os.walk(directory, followlinks=follow_links):
        for name in files:
            if name.lower().endswith(tuple(formats)):
                found.append(os.path.join(root, name))
    return sorted(found)


def index_directory(directory: "str | os.PathLike", labels: Any, formats: Sequence[str],
                    class_names: "Sequence[str] | None" = None, shuffle: bool = True, seed: "int | None" = None,
                    follow_links: bool = False) -> tuple[list[str], "np.ndarray | None", list[str]]:
    """``(file paths, integer labels or None, class names)`` of ``directory``, as Keras indexes it."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"The `directory` argument should be an existing directory. Received: directory={directory}")
    if labels == "inferred":
        subdirs = sorted(d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d)))
        if class_names is not None:
            if set(class_names) != set(subdirs):
                raise ValueError("The `class_names` passed did not match the names of the subdirectories of the "
                                 f"target directory. Expected: {subdirs} (or a subset of it), but received: "
                                 f"class_names={list(class_names)}")
            subdirs = list(class_names)
        paths, label_list = [], []
        for index, name in enumerate(subdirs):
            files = _walk(os.path.join(directory, name), formats, follow_links)
            paths += files
            label_list += [index] * len(files)
        names, label_array = list(subdirs), np.asarray(label_list, dtype=np.int32)
    else:
        paths = _walk(directory, formats, follow_links)
        names = list(class_names or [])
        if labels is None:
            label_array = None
        else:
            label_array = np.asarray(labels)
            if len(label_array) != len(paths):
                raise ValueError(f"Expected the lengths of `labels` to match the number of files in the target "
                                 f"directory. len(labels) is {len(label_array)} while we found {len(paths)} files "
                                 f"in directory {directory}.")
    if shuffle:
        seed = np.random.randint(1e6) if seed is None else seed
        order = np.arange(len(paths))
        np.random.RandomState(seed).shuffle(order)
        paths = [paths[i] for i in order]
        if label_array is not None:
            label_array = label_array[order]
    return paths, label_array, names


def _split(paths: list, labels: Any, validation_split: "float | None", subset: "str | None") -> list[tuple]:
    if not validation_split:
        return [(paths, labels)]
    count = int(validation_split * len(paths))
    train = (paths[:len(paths) - count], None if labels is None else labels[:len(paths) - count])
    val = (paths[len(paths) - count:], None if labels is None else labels[len(paths) - count:])
    return {"training": [train], "validation": [val], "both": [train, val]}[subset]


def _check_common(owner: str, labels: Any, label_mode: "str | None", validation_split: Any, subset: Any,
                  batch_size: Any, class_names: Any) -> None:
    if labels not in ("inferred", None) and not isinstance(labels, (list, tuple)):
        raise ValueError(f"{owner}: `labels` argument should be a list/tuple of integer labels, of the same size as "
                         f"the number of files in the target directory. If you wish to infer the labels from the "
                         f"subdirectory names in the target directory, pass `labels=\"inferred\"`. If you wish to get "
                         f"a dataset that only contains data (no labels), pass `labels=None`. Received: "
                         f"labels={labels}")
    if label_mode not in ("int", "categorical", "binary", None):
        raise ValueError(f'{owner}: `label_mode` argument must be one of "int", "categorical", "binary", or None. '
                         f"Received: label_mode={label_mode}")
    if class_names is not None and labels != "inferred":
        raise ValueError(f"{owner}: You can only pass `class_names` if `labels=\"inferred\"`. Received: "
                         f"labels={labels}, and class_names={class_names}")
    if validation_split is not None:
        if not 0 < validation_split < 1:
            raise ValueError(f"{owner}: `validation_split` must be between 0 and 1, received: {validation_split}")
        if subset not in ("training", "validation", "both"):
            raise ValueError(f'{owner}: `subset` must be either "training", "validation" or "both", received: '
                             f"{subset}")
    elif subset is not None:
        raise ValueError(f"{owner}: If `subset` is set, `validation_split` must be set, and inversely.")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"{owner}: batch_size must be a positive int or None, got {batch_size!r}")


def _encode_labels(labels: np.ndarray, label_mode: str, num_classes: int) -> np.ndarray:
    if label_mode == "int":
        return labels.astype(np.int32)
    if label_mode == "binary":
        return labels.astype(np.float32).reshape(-1, 1)
    out = np.zeros((len(labels), num_classes), np.float32)
    out[np.arange(len(labels)), labels.astype(np.int64)] = 1.0
    return out


class DirectoryDataset(PyDataset):
    """Batches read from files on demand: ``load(path) -> array or str`` per file, ``collate(items)`` per batch,
    with the labels encoded by ``label_mode``. ``class_names`` and ``file_paths`` as Keras's datasets have them."""

    def __init__(self, paths: list[str], labels: "np.ndarray | None", class_names: list[str], label_mode: "str | None",
                 batch_size: "int | None", load: Callable[[str], Any], collate: Callable[[list], Any]) -> None:
        super().__init__()
        self.file_paths, self.class_names = list(paths), list(class_names)
        self._labels = labels
        self.label_mode = label_mode
        self.batch_size = batch_size
        self._load, self._collate = load, collate

    def __len__(self) -> int:
        n = len(self.file_paths)
        return n if self.batch_size is None else -(-n // self.batch_size)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"DirectoryDataset: batch {index} out of range (it has {len(self)})")
        size = 1 if self.batch_size is None else self.batch_size
        chosen = slice(index * size, (index + 1) * size)
        items = self._collate([self._load(p) for p in self.file_paths[chosen]])
        if self.batch_size is None:
            items = items[0]
        if self._labels is None or self.label_mode is None:
            return items
        labels = _encode_labels(self._labels[chosen], self.label_mode, len(self.class_names))
        return items, (labels[0] if self.batch_size is None else labels)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _make(owner: str, directory: Any, labels: Any, label_mode: Any, class_names: Any, formats: Sequence[str],
          batch_size: Any, shuffle: bool, seed: Any, validation_split: Any, subset: Any, follow_links: bool,
          load: Callable, collate: Callable, verbose: bool) -> Any:
    _check_common(owner, labels, label_mode, validation_split, subset, batch_size, class_names)
    if labels is None:
        label_mode = None
    if validation_split and shuffle and seed is None:
        seed = np.random.randint(1e6)  # the two subsets must come from the one shuffle
    paths, label_array, names = index_directory(directory, labels, formats, class_names, shuffle, seed, follow_links)
    if label_mode == "binary" and len(names) != 2 and labels == "inferred":
        raise ValueError(f'{owner}: When passing `label_mode="binary"`, there must be exactly 2 class_names. Received: '
                         f"class_names={names}")
    if verbose:
        print(f"Found {len(paths)} files" + (f" belonging to {len(names)} classes." if labels == "inferred" else "."))
    if not paths:
        raise ValueError(f"No files found in directory {directory}. Allowed formats: {tuple(formats)}")
    parts = _split(paths, label_array, validation_split, subset)
    out = []
    for (p, l), name in zip(parts, ["training", "validation"] if subset == "both" else [subset]):
        if verbose and validation_split:
            print(f"Using {len(p)} files for {name}.")
        out.append(DirectoryDataset(p, l, names, label_mode, batch_size, load, collate))
    return out[0] if len(out) == 1 else tuple(out)


def image_dataset_from_directory(directory: Any, labels: Any = "inferred", label_mode: "str | None" = "int",
                                 class_names: Any = None, color_mode: str = "rgb", batch_size: "int | None" = 32,
                                 image_size: "tuple[int, int]" = (256, 256), shuffle: bool = True,
                                 seed: "int | None" = None, validation_split: "float | None" = None,
                                 subset: "str | None" = None, interpolation: str = "bilinear",
                                 follow_links: bool = False, crop_to_aspect_ratio: bool = False,
                                 pad_to_aspect_ratio: bool = False, data_format: "str | None" = None,
                                 format: str = "tf", verbose: bool = True):
    """Batches of float32 images ``(batch, height, width, channels)`` (values 0..255; ``channels_first`` puts
    the channels first) resized to ``image_size``, with their labels. Needs Pillow."""
    from .image_utils import _pil  # (deferred: Pillow is optional)
    Image = _pil("image_dataset_from_directory")
    channels = {"rgb": 3, "rgba": 4, "grayscale": 1}.get(color_mode)
    if channels is None:
        raise ValueError(f'`color_mode` must be one of {{"rgb", "rgba", "grayscale"}}. Received: color_mode={color_mode}')
    if crop_to_aspect_ratio and pad_to_aspect_ratio:
        raise ValueError("Only one of `crop_to_aspect_ratio`, `pad_to_aspect_ratio` can be set to `True`.")
    height, width = int(image_size[0]), int(image_size[1])
    methods = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
               "lanczos": Image.LANCZOS, "area": Image.BOX}
    if interpolation not in methods:
        raise ValueError(f"image_dataset_from_directory: interpolation must be one of {sorted(methods)}, got "
                         f"{interpolation!r}")
    mode = {"rgb": "RGB", "rgba": "RGBA", "grayscale": "L"}[color_mode]
    channels_first = data_format == "channels_first"

    def load(path: str) -> np.ndarray:
        with Image.open(path) as img:
            img = img.convert(mode)
            w, h = img.size
            if crop_to_aspect_ratio or pad_to_aspect_ratio:
                target = width / height
                if crop_to_aspect_ratio:
                    cw, ch = (min(w, round(h * target)), min(h, round(w / target)))
                    left, top = (w - cw) // 2, (h - ch) // 2
                    img = img.crop((left, top, left + cw, top + ch))
                else:
                    pw, ph = max(w, round(h * target)), max(h, round(w / target))
                    canvas = Image.new(mode, (pw, ph))
                    canvas.paste(img, ((pw - w) // 2, (ph - h) // 2))
                    img = canvas
            img = img.resize((width, height), methods[interpolation])
            x = np.asarray(img, dtype=np.float32)
        x = x.reshape(height, width, channels)
        return x.transpose(2, 0, 1) if channels_first else x

    return _make("image_dataset_from_directory", directory, labels, label_mode, class_names, IMAGE_FORMATS,
                 batch_size, shuffle, seed, validation_split, subset, follow_links, load, np.stack, verbose)


def text_dataset_from_directory(directory: Any, labels: Any = "inferred", label_mode: "str | None" = "int",
                                class_names: Any = None, batch_size: "int | None" = 32,
                                max_length: "int | None" = None, shuffle: bool = True, seed: "int | None" = None,
                                validation_split: "float | None" = None, subset: "str | None" = None,
                                follow_links: bool = False, format: str = "tf", verbose: bool = True):
    """Batches of the ``.txt`` files' contents (a NumPy array of Python strings, UTF-8; cut to ``max_length``
    characters when given), with their labels."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"text_dataset_from_directory: max_length must be a positive int or None, got {max_length!r}")

    def load(path: str) -> str:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        return text[:max_length] if max_length is not None else text

    def collate(items: list) -> np.ndarray:
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out

    return _make("text_dataset_from_directory", directory, labels, label_mode, class_names, (".txt",), batch_size,
                 shuffle, seed, validation_split, subset, follow_links, load, collate, verbose)


def _read_wav(path: str) -> tuple[np.ndarray, int]:
    with wave.open(path, "rb") as w:
        channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
        data = w.readframes(frames)
    if width == 1:
        samples = (np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3)
        ints = (raw[:, 0].astype(np.int32) | (raw[:, 1].astype(np.int32) << 8) | (raw[:, 2].astype(np.int32) << 16))
        samples = (np.where(ints >= 1 << 23, ints - (1 << 24), ints)).astype(np.float32) / float(1 << 23)
    elif width == 4:
        samples = np.frombuffer(data, "<i4").astype(np.float32) / float(1 << 31)
    else:
        raise ValueError(f"{path}: {8 * width}-bit WAV samples are not supported")
    return samples.reshape(-1, channels), rate


def audio_dataset_from_directory(directory: Any, labels: Any = "inferred", label_mode: "str | None" = "int",
                                 class_names: Any = None, batch_size: "int | None" = 32,
                                 sampling_rate: "int | None" = None, output_sequence_length: "int | None" = None,
                                 ragged: bool = False, shuffle: bool = True, seed: "int | None" = None,
                                 validation_split: "float | None" = None, subset: "str | None" = None,
                                 follow_links: bool = False, verbose: bool = True):
    """Batches of float32 audio ``(batch, time, channels)`` from ``.wav`` files (PCM 8/16/24/32-bit, scaled to
    [-1, 1]), each cut or zero-padded to ``output_sequence_length`` (else to the batch's longest), with their
    labels. ``sampling_rate`` checks every file's rate (dnnbind does not resample); ``ragged`` is not supported."""
    if ragged:
        raise ValueError("audio_dataset_from_directory: ragged=True is not supported by dnnbind (no ragged tensors); "
                         "use output_sequence_length")
    for name, value in (("sampling_rate", sampling_rate), ("output_sequence_length", output_sequence_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"audio_dataset_from_directory: `{name}` should be a positive int or None, got {value!r}")

    def load(path: str) -> np.ndarray:
        samples, rate = _read_wav(path)
        if sampling_rate is not None and rate != sampling_rate:
            raise ValueError(f"{path}: sampled at {rate} Hz, not sampling_rate={sampling_rate} (dnnbind does not "
                             "resample)")
        if output_sequence_length is not None:
            samples = samples[:output_sequence_length]
        return samples

    def collate(items: list) -> np.ndarray:
        length = output_sequence_length or max(len(x) for x in items)
        channels = max(x.shape[1] for x in items)
        out = np.zeros((len(items), length, channels), np.float32)
        for i, x in enumerate(items):
            out[i, :len(x), :x.shape[1]] = x
        return out

    return _make("audio_dataset_from_directory", directory, labels, label_mode, class_names, (".wav",), batch_size,
                 shuffle, seed, validation_split, subset, follow_links, load, collate, verbose)
