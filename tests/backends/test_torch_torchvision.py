"""torchvision is the reference for ResNet-50 and for Fashion-MNIST, proven here in the torch environment.

* The torch backend's ResNet-50 holds torchvision's resnet50 parameters under the same (canonical) names and
  shapes, and computes the same outputs and gradients in float64 for the same weights, in training and in
  evaluation mode.
* common/data/fashion_mnist.py's IDX reader gives exactly the arrays torchvision.datasets.FashionMNIST gives from
  the same files, and --data-dir accepts torchvision's download layout (ROOT/FashionMNIST/raw/).
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.backends.conftest import NAME
from tests.backends.numerics import IDENTICAL, relative

pytestmark = pytest.mark.skipif(NAME != "torch", reason="torch backend only")


def import_torchvision():
    """torchvision, whose models and datasets are pure Python. Its compiled operators (nms, roi_align) link
    against torch's CUDA libraries, so they do not load with torch's CPU build, and torchvision then fails to
    import where it registers fake kernels for `torchvision::nms` and `qnms` whatever loaded. When that
    happens, their two schemas are declared here first (nothing here calls them) and the import is retried."""
    import torch

    try:
        import torchvision

        return torchvision
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    global _SCHEMAS
    _SCHEMAS = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _SCHEMAS.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision

    return torchvision


_SCHEMAS = None  # the library that holds the declared schema lives as long as the process


# ------------------------------------------------------------------------------------------ ResNet-50


def canonical_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """He-scaled canonical weights with BatchNorm statistics and affine parameters moved off 0 and 1, so that
    evaluation mode reads every running statistic (in float64)."""
    from common.weights import initial_weights

    rng = np.random.default_rng(seed)
    weights = {k: v.astype(np.float64) for k, v in initial_weights("resnet50", seed, "he").items()}
    for name, value in weights.items():
        # BatchNorm gamma and variance
        if name.endswith(("running_var", ".weight")) and value.ndim == 1:
            weights[name] = rng.uniform(0.5, 1.5, value.shape)
        elif name.endswith(("running_mean", ".bias")):
            weights[name] = rng.normal(0.0, 0.1, value.shape)
    return weights


def both_networks():
    """(ours, torchvision's), each holding the same canonical weights in float64."""
    import torch

    from backends.torch.models import build, load_canonical

    ours, theirs = (
        build("resnet50").double(),
        import_torchvision().models.resnet50(weights=None).double(),
    )
    weights = canonical_weights()
    load_canonical(ours, weights)
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert unexpected == [] and all(k.endswith("num_batches_tracked") for k in missing)
    return ours, theirs


def test_resnet50_has_torchvisions_parameters_under_the_canonical_names():
    from backends.torch.models import build
    from common.architectures import spec

    ours, theirs = build("resnet50"), import_torchvision().models.resnet50(weights=None)
    shapes = {
        n: tuple(t.shape)
        for n, t in ours.state_dict().items()
        if not n.endswith("num_batches_tracked")
    }
    reference = {
        n: tuple(t.shape)
        for n, t in theirs.state_dict().items()
        if not n.endswith("num_batches_tracked")
    }
    assert shapes == reference
    assert shapes == {name: shape for name, shape, _ in spec("resnet50")}
    assert (
        sum(p.numel() for p in ours.parameters())
        == sum(p.numel() for p in theirs.parameters())
        == 25_557_032
    )


def outputs_and_gradients(net, x, y, train: bool) -> dict[str, np.ndarray]:
    """Logits, the mean cross-entropy's gradient of every parameter, and (training) the updated running
    statistics, as float64 numpy arrays by canonical name."""
    import torch

    net.train(train)
    net.zero_grad()
    logits = net(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    out = {"logits": logits.detach().numpy()}
    out |= {f"grad {n}": p.grad.numpy() for n, p in net.named_parameters()}
    if train:
        out |= {
            n: b.numpy().copy()
            for n, b in net.named_buffers()
            if not n.endswith("num_batches_tracked")
        }
    return out


@pytest.mark.parametrize("train", [True, False], ids=["train mode", "eval mode"])
def test_resnet50_computes_what_torchvision_computes_in_float64(train):
    """Same weights, same 64x64 batch: logits, gradients and (training) running statistics agree to float64
    rounding. A network that differed anywhere (the stride on the 1x1 conv as in v1, a missing max-pool, another
    padding) would give other logits at once."""
    import torch

    ours, theirs = both_networks()
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.normal(size=(4, 3, 64, 64)))
    y = torch.from_numpy(rng.integers(0, 1000, 4))
    a, b = (outputs_and_gradients(net, x, y, train) for net in (ours, theirs))
    assert a.keys() == b.keys()
    assert relative(a, b) <= IDENTICAL
    assert np.std(a["logits"]) > 1e-2  # the comparison is of numbers that say something


# --------------------------------------------------------------------------------------- Fashion-MNIST


@pytest.fixture(scope="module")
def torchvision_root(tmp_path_factory) -> Path:
    """The packaged Fashion-MNIST files laid out as torchvision's download leaves them: ROOT/FashionMNIST/raw/
    with each file both gzipped and extracted."""
    from common import data

    source = data.locate()
    root = tmp_path_factory.mktemp("torchvision")
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for stem, _ in data.fashion_mnist.FILES.values():
        packaged = data.fashion_mnist._file_in(source, stem)
        (raw / stem).write_bytes(data.fashion_mnist.read_raw(packaged))
        if (
            packaged.suffix == ".gz"
        ):  # as the dataset's package ships them (compressing again took 17 s)
            shutil.copyfile(packaged, raw / (stem + ".gz"))
        else:
            (raw / (stem + ".gz")).write_bytes(gzip.compress((raw / stem).read_bytes(), 1))
    return root


@pytest.mark.parametrize("train", [True, False], ids=["train", "test"])
def test_our_reader_gives_exactly_what_torchvision_gives(torchvision_root, train):
    from common import data

    reference = import_torchvision().datasets.FashionMNIST(
        str(torchvision_root), train=train, download=False
    )
    ours = data.load_fashion_mnist(data.locate())
    images, labels = (ours.x_train, ours.y_train) if train else (ours.x_test, ours.y_test)
    assert len(labels) == (60000 if train else 10000)
    expected_images, expected_labels = reference.data.numpy(), reference.targets.numpy()
    assert np.array_equal(np.rint(images[:, 0] * 255).astype(np.uint8), expected_images)
    # ToTensor's scaling, bit for bit
    assert np.array_equal(images[:, 0], expected_images.astype(np.float32) / 255)
    assert np.array_equal(labels, expected_labels)


@pytest.mark.parametrize("given", ["ROOT", "ROOT/FashionMNIST", "ROOT/FashionMNIST/raw"])
def test_data_dir_accepts_torchvisions_layout(torchvision_root, tmp_path, given):
    """A user who has torchvision's download passes its root (or the folder below it) as --data-dir."""
    from common import data

    only_gz = tmp_path / "root"
    shutil.copytree(
        torchvision_root,
        only_gz,
        ignore=lambda d, names: [n for n in names if "ubyte" in n and not n.endswith(".gz")],
    )
    directory = data.locate(given.replace("ROOT", str(only_gz)))
    assert directory == only_gz / "FashionMNIST" / "raw"
    assert data.verify(directory) == (60000, 10000)
