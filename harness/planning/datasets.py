"""The data of a request: which dataset and image side it uses (settled with the preset and the model), where
the images come from, and how many there are, checked (and an ImageNet-layout folder prepared) before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from common import data as datalib
from common.config import (
    ConfigError,
    check_model_input,
    datasets_for,
    default_dataset,
    image_side,
    imagenet_shaped,
)
from common.data import imagenet
from harness.errors import UsageError
from harness.planning.presets import Preset
from harness.planning.request import DataRequest, RunRequest
from harness.processes import disk


def settle_data(request: RunRequest, preset: Preset) -> tuple[Preset, RunRequest]:
    """The preset and the request with the dataset and image side the run uses: a dataset the model takes (the
    preset's where it fits, else the model's own: ImageNet-shaped synthetic images for ResNet-50 unless --data-dir
    names a folder), an image side only for ImageNet-shaped images; the request with the preset's precision too,
    where the rest of the plan reads it."""
    dataset = preset.dataset
    if request.data.dataset is None and dataset not in datasets_for(preset.model):
        dataset = default_dataset(preset.model, request.data.data_dir)
    image_size = preset.image_size if imagenet_shaped(dataset) else request.data.image_size
    try:
        check_model_input(preset.model, dataset, image_size)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    settled = request.replaced(dataset=dataset, image_size=image_size, precision=preset.precision)
    return dataclasses.replace(preset, dataset=dataset, image_size=image_size), settled


def resolve_data(
    data: DataRequest, model: str = "resnet18", sizes: tuple[int | None, int | None] = (None, None)
) -> tuple[str | None, str, tuple[int, int]]:
    """(data directory or prepared file, where the data comes from, (training images, test images)).

    The files are read and verified here, once, so that bad data is one error before anything runs; an
    ImageNet-layout folder is decoded here, `sizes` images of each split, into the one file every worker reads."""
    if data.dataset == "synthetic":
        return (
            None,
            "synthetic (random images; not Fashion-MNIST)",
            datalib.fashion_mnist.SYNTHETIC_SIZES,
        )
    if data.dataset == "imagenet-synthetic":
        side = image_side(model, data.dataset, data.image_size)
        return (
            None,
            f"synthetic ImageNet-shaped images ({side}x{side}, 1,000 classes; random, not ImageNet)",
            imagenet.SIZES,
        )
    if data.dataset == "imagenet":
        return prepare_imagenet(data, image_side(model, data.dataset, data.image_size), sizes)
    try:
        path = datalib.fashion_mnist.locate_or_download(data.data_dir)
        sizes = datalib.verify(path)
    except datalib.DataError as e:
        raise UsageError(str(e)) from None
    return (
        str(path),
        f"Fashion-MNIST IDX files in {path} (SHA-256 verified before the runs and by each worker)",
        sizes,
    )


def prepare_imagenet(
    data: DataRequest, side: int, sizes: tuple[int | None, int | None]
) -> tuple[str, str, tuple[int, int]]:
    """Decode an ImageNet-layout folder's images at `side` px once (kept in the user cache, keyed by what was
    asked), after checking that the float32 copy each worker holds fits in a quarter of this host's memory."""
    if not data.data_dir:
        raise UsageError(f"--dataset imagenet needs --data-dir: a folder {imagenet.LAYOUT}")
    folder = Path(data.data_dir)
    try:
        _, files = imagenet.files_of(folder)
    except datalib.DataError as e:
        raise UsageError(str(e)) from None
    available = (len(files["train"]), len(files["val"]))
    check_subset_sizes(data, available)
    counts = [min(asked or n, n) for asked, n in zip(sizes, available)]
    needed = sum(counts) * 3 * side * side * 4
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > memory / 4:
        raise UsageError(
            f"{counts[0]:,} + {counts[1]:,} images of {side}x{side} need {needed / 1e9:.1f} GB as float32 "
            f"in each worker, more than a quarter of this host's {memory / 1e9:.0f} GB: "
            "pass a smaller --train-size / --test-size or --image-size"
        )
    key = hashlib.sha256(f"{folder.resolve()}|{side}|{counts}|{available}".encode()).hexdigest()[
        :16
    ]
    target = (
        datalib.fashion_mnist.cache_dir().parent / "imagenet" / f"{folder.name}-{side}px-{key}.npz"
    )
    if not target.is_file():
        print(
            f"preparing {counts[0]:,} + {counts[1]:,} images of {folder} at {side}x{side} (once) ...",
            flush=True,
        )
        try:
            imagenet.prepare(folder, side, counts[0], counts[1], target)
        except datalib.DataError as e:
            raise UsageError(str(e)) from None
        except OSError as e:  # the user cache's disk is full, say: nothing has run yet
            raise UsageError(f"the decoded images' cache: {disk.not_written(target, e)}") from None
    return (
        str(target),
        f"ImageNet-layout folder {folder}: {counts[0]:,} training and {counts[1]:,} validation "
        f"images, resized and centre-cropped to {side}x{side} once before the runs",
        available,
    )


def check_subset_sizes(data: DataRequest, sizes: tuple[int, int]) -> None:
    """--train-size / --test-size may not ask for more images than the dataset has (they would be clipped
    while the report claimed the number asked for)."""
    for flag, asked, available, split in (
        ("--train-size", data.train_size, sizes[0], "training"),
        ("--test-size", data.test_size, sizes[1], "test"),
    ):
        if asked is not None and asked > available:
            raise UsageError(
                f"{flag} {asked} is more than the {available} {split} images of {data.dataset}"
            )


def explicit_size(size: int | None, dataset: str, split: int) -> int | None:
    """Synthetic ImageNet-shaped images have no "whole split": without a size, their default number."""
    return (size or imagenet.SYNTHETIC_SIZES[split]) if dataset == "imagenet-synthetic" else size
