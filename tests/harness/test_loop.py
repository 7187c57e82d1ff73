"""The one training loop's timing rule, on a trainer that records what happens in which order (no framework)."""

from __future__ import annotations

import numpy as np

from common import data as datalib
from common import loop
from common.config import RunConfig


class RecordingArray(np.ndarray):
    """Training images that log every gather (indexing with an array), as the epoch's shuffle does."""

    events: list

    def __getitem__(self, index):
        if isinstance(index, np.ndarray):
            self.events.append("gather")
        return super().__getitem__(index)


class RecordingTrainer:
    """Just enough of loop.Trainer: logs each barrier and step, so the order of events shows what the
    epoch timer (started right after a barrier, stopped right after one) encloses."""

    n_devices, rank = 1, 0

    def __init__(self, events: list):
        self.events, self.weights = events, {"w": np.zeros(1, np.float32)}

    def reset(self):
        pass

    def step(self, x, y):
        self.events.append("step")
        return (float(len(y)), 0.0)

    def sync(self):
        self.events.append("sync")

    def collect(self, handles):
        return sum(h[0] for h in handles), sum(h[1] for h in handles)

    def evaluate(self, batches):
        self.events.append("evaluate")
        return 0, sum(len(y) for _, y in batches)

    def slowest(self, seconds):
        return seconds

    def param_count(self):
        return 1

    def memory(self):
        return {}

    def stage(self, batches):
        return batches


def recording_dataset(events: list) -> datalib.Dataset:
    data = datalib.synthetic(48, 8, 0)
    x = data.x_train.view(RecordingArray)
    x.events = events
    return datalib.Dataset(data.name, data.source, x, data.y_train, data.x_test, data.y_test)


def timed_epochs(events: list) -> list[list[str]]:
    """The events between each epoch's opening barrier and its closing one: sync, step..., sync."""
    epochs, i = [], 0
    while True:
        try:
            first_step = events.index("step", i)
        except ValueError:
            return epochs
        start = max(j for j in range(i, first_step) if events[j] == "sync")
        end = events.index("sync", first_step)
        epochs.append(events[start:end + 1])
        i = end + 1


def test_an_epochs_batches_are_assembled_before_its_timer_starts():
    events = []
    cfg = RunConfig(backend="fake", strategy="fake", devices=1, model="lenet", epochs=2, batch_size=8,
                    timed_steps=0, dataset="synthetic").validate()
    loop.run_training(RecordingTrainer(events), cfg, recording_dataset(events))
    epochs = timed_epochs(events)
    assert len(epochs) == 3                                      # the warm-up step, then two epochs
    assert epochs[1] == epochs[2] == ["sync"] + ["step"] * 6 + ["sync"]   # no gather inside a timed interval
    assert events.count("gather") >= 3                          # each epoch's shuffle happened, outside
