"""ImageNet-shaped images (3 x side x side, 1,000 classes) for ResNet-50: labelled synthetic ones, or a local
ImageNet-layout folder, decoded, resized and centre-cropped once by the harness into one file of uint8 arrays that
every worker reads (the same bytes for every backend, no decoding inside a timed interval).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.data.dataset import DataError, Dataset
from common.files import write_atomic

CLASSES = 1000
# Without --train-size, as many synthetic images as fit a modest host at 224 px (float32: 3 GB for 5,120).
SYNTHETIC_SIZES = (5120, 1000)
SIZES = (
    1_281_167,
    50_000,
)  # ILSVRC-2012's training and validation images: synthetic runs ask for at most these
# torchvision's normalisation of ImageNet images (transforms.Normalize in its reference scripts)
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def synthetic(train_size: int, test_size: int, side: int, seed: int = 0) -> Dataset:
    """3 x side x side normal noise where each of the 1000 classes shifts the three channels by its own
    seeded colour: ImageNet's shape and class count, learnable, for speed runs only, labelled as synthetic.
    The test set does not depend on train_size."""
    colours = (
        np.random.default_rng([seed, 2]).normal(0.0, 1.0, (CLASSES, 3, 1, 1)).astype(np.float32)
    )

    def make(n, stream):
        rng = np.random.default_rng([seed, stream])
        y = rng.integers(0, CLASSES, n).astype(np.int32)
        x = rng.standard_normal((n, 3, side, side), dtype=np.float32)
        x += colours[y]
        return x, y

    x_train, y_train = make(train_size, 0)
    x_test, y_test = make(test_size, 1)
    return Dataset(
        "imagenet-synthetic",
        f"generated (synthetic, ImageNet-shaped {side}x{side}; not ImageNet)",
        x_train,
        y_train,
        x_test,
        y_test,
    )


IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
LAYOUT = (
    "DIR/train/<class>/<image>.JPEG and DIR/val/<class>/<image>.JPEG, one folder per class "
    "(torchvision's ImageFolder layout)"
)


def files_of(directory: Path) -> tuple[list[str], dict[str, list[tuple[Path, int]]]]:
    """(class names, {"train": [(image, label)], "val": [...]}) of an ImageNet-layout folder; the labels are the
    indices of the sorted class folders of train/, as torchvision's ImageFolder numbers them."""
    if not (directory / "train").is_dir() or not (directory / "val").is_dir():
        raise DataError(f"{directory} is not an ImageNet-layout folder: expected {LAYOUT}")
    classes = sorted(d.name for d in (directory / "train").iterdir() if d.is_dir())
    index = {name: i for i, name in enumerate(classes)}
    files = {}
    for split in ("train", "val"):
        found = []
        for folder in sorted(d for d in (directory / split).iterdir() if d.is_dir()):
            if folder.name not in index:
                raise DataError(f"{folder} is a class that train/ does not have")
            found += [
                (f, index[folder.name])
                for f in sorted(folder.iterdir())
                if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file()
            ]
        if not found:
            raise DataError(f"{directory / split} holds no images: expected {LAYOUT}")
        files[split] = found
    return classes, files


def _sample(files: list, size: int | None) -> list:
    """`size` images of the folder, the same for every run (a fixed permutation: the sorted list starts with
    one class only), in that permutation's order."""
    order = np.random.default_rng(0).permutation(len(files))
    return [files[i] for i in order[:size]]


def _center_crop(path: Path, side: int) -> np.ndarray:
    """torchvision's evaluation transform: the shorter side resized to side * 256 / 224 (bilinear), the central
    side x side square; uint8 CHW RGB."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
            scale = round(side * 256 / 224) / min(image.size)
            image = image.resize(
                (max(side, round(image.width * scale)), max(side, round(image.height * scale))),
                Image.BILINEAR,
            )
            left, top = (image.width - side) // 2, (image.height - side) // 2
            return np.asarray(image.crop((left, top, left + side, top + side)), np.uint8).transpose(
                2, 0, 1
            )
    except OSError as e:
        raise DataError(f"cannot read image {path}: {e}") from None


def prepare(
    directory: Path, side: int, train_size: int | None, test_size: int | None, target: Path
) -> tuple[int, int]:
    """Decode, resize and crop the images of an ImageNet-layout folder once, into one .npz of uint8 arrays at
    `target` (written atomically), so that every backend trains on the same bytes and no decoding is timed;
    (training images, test images)."""
    _, files = files_of(directory)
    parts = {}
    for split, size, key in (("train", train_size, "train"), ("val", test_size, "test")):
        chosen = _sample(files[split], size)
        parts[f"x_{key}"] = np.stack([_center_crop(f, side) for f, _ in chosen])
        parts[f"y_{key}"] = np.array([label for _, label in chosen], np.int32)
    write_atomic(target, lambda f: np.savez(f, **parts), "wb")
    return len(parts["y_train"]), len(parts["y_test"])


def _normalised(u8: np.ndarray) -> np.ndarray:
    return (u8.astype(np.float32) / 255.0 - MEAN[:, None, None]) / STD[:, None, None]


def load_prepared(path: Path) -> Dataset:
    """The file prepare_imagenet wrote: images normalised as torchvision's reference scripts do."""
    try:
        with np.load(path, allow_pickle=False) as f:
            parts = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except Exception as e:  # noqa: BLE001 - a damaged archive fails in many ways (zip, CRC, zlib, EOF, a missing key)
        raise DataError(
            f"cannot read the prepared ImageNet images {path}: {type(e).__name__}: {e}"
        ) from None
    for split in ("train", "test"):
        x, y = parts[f"x_{split}"], parts[f"y_{split}"]
        if (
            x.dtype != np.uint8
            or x.ndim != 4
            or x.shape[1] != 3
            or y.shape != (len(x),)
            or y.size
            and not 0 <= y.min() <= y.max() < CLASSES
        ):
            raise DataError(f"{path}: the {split} arrays are not ImageNet-shaped images and labels")
    return Dataset(
        "imagenet",
        str(path),
        _normalised(parts["x_train"]),
        parts["y_train"].astype(np.int32),
        _normalised(parts["x_test"]),
        parts["y_test"].astype(np.int32),
    )


def load(cfg) -> Dataset:
    """The ImageNet-shaped dataset a run config asks for."""
    if cfg.dataset == "imagenet-synthetic":
        return synthetic(
            cfg.train_size or SYNTHETIC_SIZES[0],
            cfg.test_size or SYNTHETIC_SIZES[1],
            cfg.image_side,
            cfg.seed,
        )
    return load_prepared(Path(cfg.data_dir))
