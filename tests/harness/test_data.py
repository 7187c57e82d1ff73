"""The IDX reader, the dataset search and checksums, and the shared batch order."""

from __future__ import annotations

import numpy as np
import pytest

from common import data as datalib
from common.data import fashion_mnist
from tests.harness.helpers import idx_bytes, write_idx


def test_reads_small_idx_files_plain_and_gzipped(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    labels = np.array([7, 1], dtype=np.uint8)
    a = fashion_mnist.read_idx(write_idx(tmp_path / "img", images))
    b = fashion_mnist.read_idx(write_idx(tmp_path / "lab", labels, compress=True))
    assert a.shape == (2, 3, 4) and a.dtype == np.uint8 and int(a.sum()) == sum(range(24))
    assert b.tolist() == [7, 1]


def test_rejects_bad_magic_and_truncated_files():
    with pytest.raises(datalib.DataError, match="bad magic"):
        fashion_mnist.read_idx_bytes(b"\x01\x00\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(datalib.DataError, match="size mismatch"):
        fashion_mnist.read_idx_bytes(idx_bytes(np.zeros((4, 2), np.uint8))[:-1])
    with pytest.raises(datalib.DataError, match="unknown IDX element type"):
        fashion_mnist.read_idx_bytes(b"\x00\x00\x07\x01\x00\x00\x00\x01\x05")


def fake_dataset_dir(tmp_path, n_train=6, n_test=4):
    rng = np.random.default_rng(0)
    write_idx(
        tmp_path / "train-images-idx3-ubyte", rng.integers(0, 256, (n_train, 28, 28)), compress=True
    )
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(n_train) % 10, compress=True)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(n_test) % 10)
    return tmp_path


def test_checksums_are_verified(tmp_path):
    directory = fake_dataset_dir(tmp_path)
    with pytest.raises(datalib.DataError, match="checksum mismatch"):
        datalib.load_fashion_mnist(directory)
    unverified = datalib.load_fashion_mnist(directory, verify=False)
    assert unverified.x_train.shape == (6, 1, 28, 28) and unverified.x_train.dtype == np.float32
    assert 0.0 <= unverified.x_train.min() and unverified.x_train.max() <= 1.0
    assert unverified.y_test.tolist() == [0, 1, 2, 3]


def test_search_order_data_dir_then_environment(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = fake_dataset_dir(tmp_path / "a"), fake_dataset_dir(tmp_path / "b")
    monkeypatch.setenv(fashion_mnist.ENV_VAR, str(second))
    assert datalib.locate(str(first)) == first
    assert datalib.locate() == second
    assert [label for label, _ in fashion_mnist.candidate_dirs(str(first))][:2] == [
        "--data-dir",
        "$FASHION_MNIST_DIR",
    ]


def test_missing_data_gives_instructions(tmp_path, monkeypatch):
    monkeypatch.delenv(fashion_mnist.ENV_VAR, raising=False)
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", tmp_path / "none")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(datalib.DataError, match="apt-get install dataset-fashion-mnist"):
        datalib.locate()


@pytest.mark.skipif(
    not fashion_mnist.has_all_files(fashion_mnist.DEBIAN_DIR),
    reason="dataset-fashion-mnist not installed",
)
def test_real_fashion_mnist_files():
    # verifies the SHA-256 of all four files
    ds = datalib.load_fashion_mnist(fashion_mnist.DEBIAN_DIR)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    assert ds.y_train[:5].tolist() == [
        9,
        0,
        0,
        3,
        0,
    ]  # ankle boot, T-shirt, T-shirt, dress, T-shirt
    assert abs(float(ds.x_train.mean()) - 0.2860) < 1e-3


def small(n=10, seed=0):
    return datalib.synthetic(n, 4, seed)


def test_batches_are_a_function_of_seed_and_epoch():
    ds = small(10)
    run = lambda seed, epoch: [y.tolist() for _, y in datalib.train_batches(ds, 4, seed, epoch)]
    assert run(0, 0) == run(0, 0)
    assert run(0, 0) != run(0, 1) and run(0, 0) != run(1, 0)
    order = datalib.epoch_permutation(10, 0, 0)
    xs = [x for x, _ in datalib.train_batches(ds, 4, 0, 0)]
    # 10 // 4 = 2: the partial batch is dropped
    assert len(xs) == 2 and all(len(x) == 4 for x in xs)
    assert np.array_equal(np.concatenate(xs), ds.x_train[order[:8]])


def test_data_hash_follows_order_not_batch_size():
    ds = small(16)
    h = datalib.batch_sequence_hash
    assert h(ds, 4, 0, 2) == h(ds, 8, 0, 2)  # same examples in the same order
    assert h(ds, 4, 0, 2) != h(ds, 4, 1, 2)  # another seed, another order
    assert h(ds, 4, 0, 2) != h(ds, 4, 0, 1)
    assert h(ds, 4, 0, 2) != h(small(16, seed=1), 4, 0, 2)  # other content


def test_test_batches_cover_the_test_set_once():
    ds = small(8)
    ys = [y for _, y in datalib.test_batches(ds, 3)]
    assert [len(y) for y in ys] == [3, 1] and np.array_equal(np.concatenate(ys), ds.y_test)
