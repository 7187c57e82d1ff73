"""The run's presets: the defaults of a `run` (model, epochs, batch and learning rate per device, data), which
its flags override one by one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A run's defaults. Batch and learning rate are per device and scale with the device count, as d2l does
    (bs 256 / lr 0.1 on one GPU, bs 512 / lr 0.2 on two); --batch-size / --lr fix them instead."""

    title: str
    model: str
    epochs: int
    batch_per_device: int
    lr_per_device: float
    train_size: int | None
    test_size: int | None
    timed_steps: int
    batch_size: int | None = None  # --batch-size: the global batch, whatever the device count
    lr: float | None = None  # --lr: the learning rate, whatever the device count
    dataset: str = "fashion-mnist"
    image_size: int | None = None  # the side of ImageNet-shaped images (None: the model's, 224)
    precision: str = "fp32"
    init: str = "d2l"  # the initial weights (common/weights.py)
    # stop a run at the first epoch whose test accuracy reaches it (--target-accuracy); None: every epoch
    target_accuracy: float | None = None

    def with_flags(self, *groups) -> "Preset":
        """The preset with the value of every flag the request's `groups` give (a field of PRESET_FLAGS that is not
        None) in place of its own."""
        given = {
            name: getattr(group, name)
            for group in groups
            for name in PRESET_FLAGS
            if getattr(group, name, None) is not None
        }
        return dataclasses.replace(self, **given)

    def batch(self, devices: int) -> int:
        return self.batch_size if self.batch_size is not None else self.batch_per_device * devices

    def learning_rate(self, devices: int) -> float:
        return self.lr if self.lr is not None else self.lr_per_device * devices


# The flags that override a preset's value (their default, None, leaves it).
PRESET_FLAGS = (
    "model",
    "epochs",
    "train_size",
    "test_size",
    "timed_steps",
    "batch_size",
    "lr",
    "dataset",
    "image_size",
    "precision",
    "init",
    "target_accuracy",
)

# LeNet's time-to-accuracy preset on a CPU, measured on a 2-core host (docs/time-to-accuracy.md).
TARGET_LENET = 0.85
LENET_EPOCHS = 10
LENET_BATCH = 128
LENET_LR = 0.1

# d2l's recipe (GPU) and a quick CPU preset that finishes in a few minutes on 2 cores; ResNet-50 on
# ImageNet-shaped synthetic images, for the GPU (torchvision's recipe: batch 256 and lr 0.1 per device, in bf16,
# the throughput NVIDIA publishes) and a few steps on small images for the CPU.
PRESETS = {
    "d2l": Preset(
        "d2l recipe",
        model="resnet18",
        epochs=10,
        batch_per_device=256,
        lr_per_device=0.1,
        train_size=None,
        test_size=None,
        timed_steps=50,
    ),
    # time to accuracy (docs/time-to-accuracy.md): d2l's recipe stopped at the seed chapter's 0.91, at most its 10
    # epochs; LeNet on all of Fashion-MNIST to TARGET_LENET on a CPU in minutes
    "d2l-target": Preset(
        "d2l recipe to 0.91 test accuracy",
        model="resnet18",
        epochs=10,
        batch_per_device=256,
        lr_per_device=0.1,
        train_size=None,
        test_size=None,
        timed_steps=50,
        target_accuracy=0.91,
    ),
    "lenet-target": Preset(
        f"LeNet to {TARGET_LENET} test accuracy (CPU)",
        model="lenet",
        epochs=LENET_EPOCHS,
        batch_per_device=LENET_BATCH,
        lr_per_device=LENET_LR,
        train_size=None,
        test_size=None,
        timed_steps=10,
        init="he",
        target_accuracy=TARGET_LENET,
    ),
    "quick": Preset(
        "CPU quick preset (data subset)",
        model="resnet18",
        epochs=2,
        batch_per_device=32,
        lr_per_device=0.05,
        train_size=2048,
        test_size=1000,
        timed_steps=10,
    ),
    "resnet50": Preset(
        "ResNet-50 throughput preset (224x224 synthetic images, bf16)",
        model="resnet50",
        epochs=1,
        batch_per_device=256,
        lr_per_device=0.1,
        train_size=5120,
        test_size=1000,
        timed_steps=50,
        dataset="imagenet-synthetic",
        image_size=224,
        precision="bf16",
    ),
    "resnet50-quick": Preset(
        "ResNet-50 CPU quick preset (a few steps on 32x32 synthetic images)",
        model="resnet50",
        epochs=1,
        batch_per_device=4,
        lr_per_device=0.1 * 4 / 256,
        train_size=32,
        test_size=16,
        timed_steps=3,
        dataset="imagenet-synthetic",
        image_size=32,
    ),
}
