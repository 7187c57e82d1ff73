"""The ResNet-50 workload on the harness side: its canonical spec, the datasets it takes (synthetic ImageNet-shaped
images and an ImageNet-layout folder), the presets, the refusals, and what the report adds for it."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from common import architectures
from common.config import ConfigError, RunConfig
from common.data import DataError, imagenet
from harness import cli
from tests.harness.helpers import assert_refused


def build_plan(*args: str):
    return cli.build_plan(
        cli.build_parser().parse_args(["--device", "cpu", "--backend", "torch", *args])
    )


# --------------------------------------------------------------------------------------------- the model


def test_resnet50_spec_is_torchvisions_resnet50():
    """25,557,032 trainable parameters (torchvision's count), bias-free convolutions, v1.5's strides: the 3x3
    conv of each first bottleneck of layers 2-4 and its downsample are the layer's only strided convs."""
    spec = architectures.spec("resnet50")
    assert architectures.trainable_count("resnet50") == 25_557_032
    shapes = {name: shape for name, shape, _ in spec}
    assert not [
        name
        for name in shapes
        if name.endswith(".bias")
        and ".bn" not in name
        and "downsample.1" not in name
        and not name.startswith(("bn1", "fc"))
    ]
    assert shapes["conv1.weight"] == (64, 3, 7, 7) and shapes["fc.weight"] == (1000, 2048)
    assert shapes["layer2.0.conv2.weight"] == (128, 128, 3, 3) and shapes[
        "layer2.0.conv1.weight"
    ] == (128, 256, 1, 1)
    assert shapes["layer4.0.downsample.0.weight"] == (2048, 1024, 1, 1)
    assert sum(1 for name in shapes if name.endswith("conv3.weight")) == 3 + 4 + 6 + 3


def test_a_model_takes_only_the_datasets_of_its_input():
    cfg = RunConfig(
        backend="torch", strategy="ddp", devices=1, model="resnet50", dataset="imagenet-synthetic"
    )
    assert cfg.validate().image_side == 224
    with pytest.raises(ConfigError, match="resnet50 does not take fashion-mnist images"):
        RunConfig(backend="torch", strategy="ddp", devices=1, model="resnet50").validate()
    with pytest.raises(ConfigError, match="lenet does not take imagenet-synthetic images"):
        RunConfig(
            backend="torch", strategy="ddp", devices=1, model="lenet", dataset="imagenet-synthetic"
        ).validate()
    with pytest.raises(ConfigError, match="--image-size must be between 32 and 1024"):
        RunConfig(
            backend="torch",
            strategy="ddp",
            devices=1,
            model="resnet50",
            dataset="imagenet-synthetic",
            image_size=16,
        ).validate()
    with pytest.raises(ConfigError, match="images are 28x28"):
        RunConfig(
            backend="torch", strategy="ddp", devices=1, model="resnet18", image_size=64
        ).validate()


# ---------------------------------------------------------------------------------------- synthetic images


def test_synthetic_imagenet_images_are_seeded_labelled_and_learnable():
    a, b = imagenet.synthetic(20, 6, 32, seed=3), imagenet.synthetic(40, 6, 32, seed=3)
    assert (
        a.x_train.shape == (20, 3, 32, 32)
        and a.x_train.dtype == np.float32
        and a.y_train.dtype == np.int32
    )
    # the test set: fixed
    assert np.array_equal(a.x_test, b.x_test) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_train, imagenet.synthetic(20, 6, 32, seed=4).x_train)
    assert "synthetic" in a.source and "not ImageNet" in a.source
    # each class shifts the channel means by its own colour (std 1) over noise whose mean over 32x32 pixels has
    # std 1/32: images of one class share their channel means, images of two classes do not
    many = imagenet.synthetic(3000, 1, 32, seed=0)
    means, y = many.x_train.mean(axis=(2, 3)), many.y_train
    same = [(i, j) for i in range(len(y)) for j in np.flatnonzero(y == y[i]) if j > i]
    assert len(same) > 100 and max(np.abs(means[i] - means[j]).max() for i, j in same) < 0.25
    others = np.abs(means[:1000] - means[1000:2000])[y[:1000] != y[1000:2000]]
    assert others.mean() > 0.5


# ------------------------------------------------------------------------------ an ImageNet-layout folder


def write_folder(root, classes=("n01", "n02"), per_class=(3, 2), size=(40, 30)):
    """DIR/train/<class>/*.JPEG and DIR/val/<class>/*.png: image i of class c is a flat colour (c, i, 7)."""
    for split, n in zip(("train", "val"), per_class):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                suffix = ".JPEG" if split == "train" else ".png"
                Image.new("RGB", size, (10 * c, 10 * i, 7)).save(
                    root / split / name / f"{i}{suffix}", quality=100
                )
    return root


def test_a_folder_is_prepared_once_into_the_same_bytes_for_every_backend(tmp_path):
    folder = write_folder(tmp_path / "imagenet")
    target = tmp_path / "prepared.npz"
    assert imagenet.prepare(folder, 32, None, None, target) == (6, 4)
    with np.load(target) as f:
        x, y = f["x_train"], f["y_train"]
    assert x.shape == (6, 3, 32, 32) and x.dtype == np.uint8
    assert sorted(y.tolist()) == [0, 0, 0, 1, 1, 1]  # classes numbered as ImageFolder does
    for image, label in zip(x, y):  # flat colours survive resize and crop
        assert abs(int(image[0].mean()) - 10 * label) <= 1 and abs(int(image[2].mean()) - 7) <= 1
    data = imagenet.load_prepared(target)
    assert data.x_test.shape == (4, 3, 32, 32) and data.x_train.dtype == np.float32
    expected = (x[0, :, 0, 0] / 255 - imagenet.MEAN) / imagenet.STD  # torchvision's normalisation
    assert np.allclose(data.x_train[0, :, 0, 0], expected, rtol=0, atol=1e-6)
    assert imagenet.prepare(folder, 32, 2, 1, tmp_path / "few.npz") == (2, 1)


def test_the_centre_crop_is_torchvisions_resize_then_crop(tmp_path):
    """A 60x40 image whose columns are numbered: resized so the shorter side is 32 * 256 / 224 = 37 (56x37), the
    central 32 columns start at column 12 of the resized image."""
    path = tmp_path / "ramp.png"
    ramp = np.tile(np.linspace(0, 240, 60).astype(np.uint8), (40, 1))
    Image.fromarray(np.stack([ramp] * 3, axis=-1)).save(path)
    crop = imagenet._center_crop(path, 32)
    resized = np.asarray(Image.open(path).convert("RGB").resize((56, 37), Image.BILINEAR))
    assert crop.shape == (3, 32, 32)
    assert np.array_equal(crop.transpose(1, 2, 0), resized[2:34, 12:44])


@pytest.mark.parametrize(
    "damage, match",
    [
        (
            lambda root: (root / "val").rename(root / "validation"),
            "not an ImageNet-layout folder: expected DIR/train",
        ),
        (lambda root: (root / "val" / "n03").mkdir(), "is a class that train/ does not have"),
        (
            lambda root: (root / "train" / "n01" / "0.JPEG").write_bytes(b"not an image"),
            "cannot read image",
        ),
    ],
)
def test_a_bad_folder_is_one_clear_error(tmp_path, damage, match):
    folder = write_folder(tmp_path / "imagenet")
    damage(folder)
    with pytest.raises(DataError, match=match):
        imagenet.prepare(folder, 32, None, None, tmp_path / "p.npz")
    assert not (tmp_path / "p.npz").exists() and not list(tmp_path.glob(".p.npz*"))


def test_a_damaged_prepared_file_is_a_data_error(tmp_path):
    target = tmp_path / "p.npz"
    imagenet.prepare(write_folder(tmp_path / "imagenet"), 32, None, None, target)
    target.write_bytes(target.read_bytes()[:100])
    with pytest.raises(DataError, match="cannot read the prepared ImageNet images"):
        imagenet.load_prepared(target)
    np.savez(
        target,
        x_train=np.zeros((2, 1, 32, 32), np.uint8),
        y_train=np.zeros(2, np.int32),
        x_test=np.zeros((1, 3, 32, 32), np.uint8),
        y_test=np.zeros(1, np.int32),
    )
    with pytest.raises(DataError, match="not ImageNet-shaped"):
        imagenet.load_prepared(target)


# ------------------------------------------------------------------------------------- presets and flags


def test_the_resnet50_presets():
    gpu = build_plan("--preset", "resnet50", "--gpus", "1,2", "--strategy", "ddp").configs
    assert [
        (c.model, c.dataset, c.image_side, c.levers.precision, c.batch_size, c.lr) for c in gpu
    ] == [
        ("resnet50", "imagenet-synthetic", 224, "bf16", 256, 0.1),
        ("resnet50", "imagenet-synthetic", 224, "bf16", 512, 0.2),
    ]
    quick = build_plan("--preset", "resnet50-quick", "--gpus", "2", "--strategy", "ddp").configs[0]
    assert (quick.image_side, quick.levers.precision, quick.batch_size, quick.train_size) == (
        32,
        "fp32",
        8,
        32,
    )


def test_resnet50_with_the_default_preset_takes_synthetic_imagenet_images_and_the_others_keep_fashion_mnist(
    tmp_path,
):
    cfg = build_plan("--model", "resnet50", "--gpus", "1", "--strategy", "ddp").configs[0]
    assert (cfg.dataset, cfg.image_side, cfg.train_size) == ("imagenet-synthetic", 224, 2048)
    cfg = build_plan(
        "--preset",
        "resnet50",
        "--model",
        "lenet",
        "--gpus",
        "1",
        "--strategy",
        "ddp",
        "--dataset",
        "synthetic",
    ).configs[0]
    assert (cfg.dataset, cfg.image_side, cfg.image_size) == ("synthetic", 28, None)


@pytest.mark.parametrize(
    "args, match",
    [
        (
            ("--model", "resnet50", "--dataset", "fashion-mnist"),
            "--model resnet50 does not take fashion-mnist images",
        ),
        (
            ("--model", "resnet50", "--image-size", "16"),
            "--image-size must be between 32 and 1024 for resnet50",
        ),
        (
            ("--model", "resnet18", "--dataset", "synthetic", "--image-size", "64"),
            "images are 28x28",
        ),
        (("--model", "resnet50", "--dataset", "imagenet"), "--dataset imagenet needs --data-dir"),
    ],
)
def test_bad_resnet50_requests_are_refused(tmp_path, args, match):
    assert_refused(tmp_path, "--backend", "torch", *args, match=match, dataset=())


def test_an_imagenet_folder_is_prepared_before_the_runs_and_each_run_reads_the_file(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = write_folder(tmp_path / "imagenet")
    plan_ = build_plan(
        "--model",
        "resnet50",
        "--dataset",
        "imagenet",
        "--data-dir",
        str(folder),
        "--image-size",
        "32",
        "--train-size",
        "4",
        "--test-size",
        "2",
        "--batch-size",
        "2",
        "--gpus",
        "1,2",
        "--strategy",
        "ddp",
    )
    files = {c.data_dir for c in plan_.configs}
    assert len(files) == 1 and str(tmp_path / "cache") in files.pop()
    data = imagenet.load(plan_.configs[0])
    assert data.x_train.shape == (4, 3, 32, 32) and data.x_test.shape == (2, 3, 32, 32)
    assert "4 training and 2 validation images" in plan_.data_source


def test_an_imagenet_folder_of_the_wrong_layout_is_refused(tmp_path):
    (tmp_path / "photos").mkdir()
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--model",
        "resnet50",
        "--dataset",
        "imagenet",
        "--data-dir",
        str(tmp_path / "photos"),
        match="not an ImageNet-layout folder",
        dataset=(),
    )


def test_check_refuses_models_of_different_inputs_together(tmp_path):
    assert_refused(
        tmp_path,
        "--backend",
        "torch",
        "--model",
        "lenet,resnet50",
        match="check models that take other images separately",
        command=("check",),
        dataset=(),
    )
