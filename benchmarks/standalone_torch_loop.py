"""The standalone side of benchmarks/harness_overhead.py: a plain PyTorch training loop, no harness code
except the model, its canonical weights and the data. Run in the torch environment:

    python -m benchmarks.standalone_torch_loop MODEL LR TRAIN_SIZE BATCH THREADS SEED

It prints one JSON line: images/s, the mean training loss, and the hashes of its start and its batches.
"""

import json
import sys
import time

import torch
from torch.nn import functional as F

from backends.torch.models import build, load_canonical, to_canonical
from common.data import batch_sequence_hash, epoch_permutation, load_fashion_mnist, locate
from common.weights import fingerprint, initial_weights


def main(argv: list[str]) -> None:
    model, lr = argv[0], float(argv[1])
    train_size, batch, threads, seed = map(int, argv[2:6])
    torch.set_num_threads(threads)
    ds = load_fashion_mnist(locate(), train_size, 1)
    order = epoch_permutation(
        len(ds.y_train), seed, 0
    )  # the harness's first epoch, shuffled outside the timer
    xs, ys = torch.from_numpy(ds.x_train[order]), torch.from_numpy(ds.y_train[order]).long()
    weights = initial_weights(model, seed)
    net = build(model)
    opt = torch.optim.SGD(net.parameters(), lr=lr)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    load_canonical(net, weights)
    step(xs[:batch], ys[:batch])  # warm-up, then back to the initial weights, as the harness does
    load_canonical(net, weights)
    start_hash = fingerprint(to_canonical(net))
    steps = len(ys) // batch
    start = time.perf_counter()
    losses = [
        step(xs[i * batch : (i + 1) * batch], ys[i * batch : (i + 1) * batch]) for i in range(steps)
    ]
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "images_per_s": steps * batch / seconds,
                "train_loss": float(torch.stack(losses).mean()),
                "weights_hash": start_hash,
                "data_hash": batch_sequence_hash(ds, batch, seed, 1),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
