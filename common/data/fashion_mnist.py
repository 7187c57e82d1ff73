"""Fashion-MNIST: find, verify and read the IDX files (the Debian package, FASHION_MNIST_DIR, --data-dir in the
original or torchvision's layout, or a download), and the synthetic stand-in of the same shape (by flag only,
and labelled as synthetic)."""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import urllib.request
import zlib
from pathlib import Path

import numpy as np

from common.data.dataset import DataError, Dataset
from common.files import write_atomic

OFFICIAL_MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
ENV_VAR = "FASHION_MNIST_DIR"

# SHA-256 of the *decompressed* IDX content: it holds however the files were
# compressed (the Debian package recompresses them, so the official .gz MD5s differ).
FILES = {
    "train_images": (
        "train-images-idx3-ubyte",
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    ),
    "train_labels": (
        "train-labels-idx1-ubyte",
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    ),
    "test_images": (
        "t10k-images-idx3-ubyte",
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    ),
    "test_labels": (
        "t10k-labels-idx1-ubyte",
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    ),
}

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


# --------------------------------------------------------------------------- IDX


def read_idx_bytes(raw: bytes) -> np.ndarray:
    """Parse one IDX file (the MNIST format): magic 0x0000 <type> <ndim>, big-endian dims, data."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError("not an IDX file (bad magic number)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in IDX_DTYPES:
        raise DataError(f"unknown IDX element type 0x{type_code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError("truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[type_code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"IDX size mismatch: header says {shape}, file holds {len(raw) - header} data bytes"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def read_raw(path: Path) -> bytes:
    """Bytes of an IDX file, decompressing `.gz` transparently."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as e:  # unreadable, truncated or corrupt .gz
        raise DataError(f"cannot read {path}: {e}") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    return read_idx_bytes(read_raw(Path(path)))


# ---------------------------------------------------------------------- locating


def _file_in(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def has_all_files(directory: Path) -> bool:
    return all(_file_in(directory, stem) for stem, _ in FILES.values())


TORCHVISION_LAYOUT = (
    "FashionMNIST/raw",
    "raw",
)  # torchvision's download: ROOT/FashionMNIST/raw/*.gz


def files_dir(directory: Path) -> Path | None:
    """The folder holding the four files: `directory` itself, or below it in torchvision's download layout
    (given its root or its FashionMNIST folder); None if neither holds them."""
    for candidate in (directory, *(directory / below for below in TORCHVISION_LAYOUT)):
        if has_all_files(candidate):
            return candidate
    return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dpbench" / "fashion-mnist"


def candidate_dirs(data_dir: str | None = None) -> list[tuple[str, Path]]:
    """Where the files are looked for, in order (--data-dir, env, Debian package, cache; README "Data")."""
    found = []
    if data_dir:
        found.append(("--data-dir", Path(data_dir)))
    if os.environ.get(ENV_VAR):
        found.append((f"${ENV_VAR}", Path(os.environ[ENV_VAR])))
    found.append(("Debian package dataset-fashion-mnist", DEBIAN_DIR))
    found.append(("user cache", cache_dir()))
    return found


def locate(data_dir: str | None = None) -> Path:
    """The directory holding the four files. An explicit --data-dir must hold them."""
    if data_dir is not None:
        d = Path(data_dir)
        if not d.is_dir():
            raise DataError(
                f"--data-dir {data_dir} "
                + ("is not a directory" if d.exists() else "does not exist")
            )
        found = files_dir(d)
        if found is None:
            missing = [stem for stem, _ in FILES.values() if not _file_in(d, stem)]
            raise DataError(
                f"--data-dir {data_dir} lacks Fashion-MNIST files: {', '.join(missing)} "
                "(nor does it hold them in torchvision's layout, FashionMNIST/raw/)"
            )
        return found
    for _, d in candidate_dirs():
        found = files_dir(d)
        if found is not None:
            return found
    raise DataError(
        "Fashion-MNIST not found (looked in $FASHION_MNIST_DIR, "
        f"{DEBIAN_DIR}, {cache_dir()}); install it with `apt-get install dataset-fashion-mnist`, "
        "pass --data-dir, or let the harness download it (needs network)"
    )


def download(dest: Path | None = None, mirror: str = OFFICIAL_MIRROR) -> Path:
    """Fetch the four files from the official mirror into the cache, verifying each checksum."""
    dest = dest or cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for stem, sha in FILES.values():
        target = dest / (stem + ".gz")
        if target.is_file():
            continue
        url = mirror + stem + ".gz"
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                payload = r.read()
        except OSError as e:
            raise DataError(
                f"could not download {url}: {e}; install `dataset-fashion-mnist` or pass --data-dir"
            ) from e
        actual = hashlib.sha256(gzip.decompress(payload)).hexdigest()
        if actual != sha:
            raise DataError(f"checksum mismatch for downloaded {url}: {actual} != {sha}")
        write_atomic(target, lambda f: f.write(payload), mode="wb")
    return dest


def locate_or_download(data_dir: str | None = None) -> Path:
    if data_dir is not None:
        return locate(data_dir)
    try:
        return locate()
    except DataError as not_found:
        try:
            return download()
        except DataError as e:
            raise DataError(f"{not_found}. Download failed too: {e}") from None


def _load_verified(directory: Path, key: str, verify: bool) -> np.ndarray:
    stem, sha = FILES[key]
    path = _file_in(directory, stem)
    if path is None:
        raise DataError(f"{directory} lacks {stem}")
    raw = read_raw(path)
    if verify:
        actual = hashlib.sha256(raw).hexdigest()
        if actual != sha:
            raise DataError(
                f"checksum mismatch for {path}: got {actual[:16]}..., expected {sha[:16]}..."
            )
    try:
        return read_idx_bytes(raw)
    except DataError as e:
        raise DataError(f"{path}: {e}") from None


def _read_parts(directory: Path, verify: bool) -> dict[str, np.ndarray]:
    """The four arrays, checked to be 28x28 images with one label each."""
    parts = {key: _load_verified(directory, key, verify) for key in FILES}
    for split in ("train", "test"):
        images, labels = parts[f"{split}_images"], parts[f"{split}_labels"]
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1:
            raise DataError(
                f"{directory}: the {split} files hold arrays of shape {images.shape} and "
                f"{labels.shape}, not 28x28 images and their labels"
            )
        if len(images) != len(labels):
            raise DataError(f"{directory}: {len(images)} {split} images but {len(labels)} labels")
    return parts


def verify(directory: Path) -> tuple[int, int]:
    """Read and check the four files once (checksums, format, one label per image); the number of
    training and test images. The harness calls it before any run, so bad data is one error, not one per run."""
    parts = _read_parts(directory, verify=True)
    return len(parts["train_labels"]), len(parts["test_labels"])


def _images(u8: np.ndarray) -> np.ndarray:
    return (u8.astype(np.float32) / 255.0)[:, None, :, :]


def load_fashion_mnist(
    directory: Path,
    train_size: int | None = None,
    test_size: int | None = None,
    verify: bool = True,
) -> Dataset:
    """Read and verify the four files; keep the first train_size / test_size examples."""
    parts = _read_parts(directory, verify)
    return Dataset(
        name="fashion-mnist",
        source=str(directory),
        x_train=_images(parts["train_images"][:train_size]),
        y_train=parts["train_labels"][:train_size].astype(np.int32),
        x_test=_images(parts["test_images"][:test_size]),
        y_test=parts["test_labels"][:test_size].astype(np.int32),
    )


def synthetic(train_size: int, test_size: int, seed: int = 0) -> Dataset:
    """Noise images where the label brightens its own 5x5 patch (a 2 x 5 grid of patches): easy to
    learn, for smoke runs only, and labelled as synthetic. The test set does not depend on train_size."""

    def make(n, stream):
        rng = np.random.default_rng([seed, stream])
        y = rng.integers(0, 10, n).astype(np.int32)
        x = rng.random((n, 1, 28, 28), dtype=np.float32) * 0.5
        for label in range(10):
            row, col = 4 + 14 * (label // 5), 1 + 5 * (label % 5)
            x[y == label, 0, row : row + 5, col : col + 5] += 0.5
        return x, y

    x_train, y_train = make(train_size, 0)
    x_test, y_test = make(test_size, 1)
    return Dataset(
        "synthetic", "generated (synthetic; not Fashion-MNIST)", x_train, y_train, x_test, y_test
    )


SYNTHETIC_SIZES = (60000, 10000)  # as many images as Fashion-MNIST
