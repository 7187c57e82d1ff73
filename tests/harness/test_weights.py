"""Canonical weights: framework-free architecture specs, the seeded initialiser, the weights file."""

from __future__ import annotations

import numpy as np
import pytest

from common import architectures, weights

FINGERPRINTS = {  # also asserted against every backend by tests/backends/test_contract.py
    "resnet18": "1edb562911f9087d60faa0220f475e76ee56775bafc7aab1c426b9bec6b44e2c",
    "lenet": "d4edbb487ad27285ea3211f777ff08bd27ba74ca46cc26104b6344a7ef061a0f",
}


def test_specs_have_the_published_parameter_counts():
    assert architectures.trainable_count("resnet18") == 11_175_818
    assert architectures.trainable_count("lenet") == 129_068
    assert len(architectures.spec("resnet18")) == 110


@pytest.mark.parametrize("model", ["resnet18", "lenet"])
def test_initial_weights_fingerprint(model):
    assert weights.fingerprint(weights.initial_weights(model, 0)) == FINGERPRINTS[model]


def test_initialisation_follows_d2l():
    w = weights.initial_weights("resnet18", 0)
    conv = w["stage4.0.conv1.weight"]
    assert conv.shape == (512, 256, 3, 3) and conv.dtype == np.float32
    assert abs(float(conv.std()) - 0.01) < 2e-4 and abs(float(conv.mean())) < 1e-4
    assert (
        not w["fc.bias"].any() and (w["bn.running_var"] == 1).all() and (w["bn.weight"] == 1).all()
    )


def test_values_do_not_depend_on_parameter_order():
    spec = architectures.spec("lenet")
    a = weights.init_canonical(spec, 3)
    b = weights.init_canonical(list(reversed(spec)), 3)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_weights_file_round_trip_and_tamper_check(tmp_path):
    w = weights.initial_weights("lenet", 1)
    digest = weights.save(tmp_path / "w.npz", w)
    assert digest == weights.fingerprint(w)
    back = weights.load(tmp_path / "w.npz", model="lenet")
    assert all(np.array_equal(back[k], w[k]) for k in w)
    with pytest.raises(weights.WeightsError, match="does not hold resnet18 weights"):
        weights.load(tmp_path / "w.npz", model="resnet18")
    w["fc2.bias"][0] = 1.0
    np.savez(
        tmp_path / "bad.npz", **w, **{weights.HASH_KEY: np.frombuffer(digest.encode(), np.uint8)}
    )
    with pytest.raises(weights.WeightsError, match="does not match its recorded fingerprint"):
        weights.load(tmp_path / "bad.npz")
    with pytest.raises(weights.WeightsError, match="cannot read"):
        weights.load(tmp_path / "missing.npz")


def test_checkpoints_and_results_get_the_mode_of_a_plainly_created_file(tmp_path):
    """0644 under umask 022 (mkstemp alone gives 0600): readable where report.md beside them is."""
    import os
    import stat

    from common.files import write_json_atomic

    old = os.umask(0o022)
    try:
        weights.save(tmp_path / "w.npz", weights.init_canonical(architectures.spec("lenet"), 0))
        write_json_atomic(tmp_path / "r.json", {"a": 1})
        (tmp_path / "plain.md").write_text("x")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"w.npz": 0o644, "r.json": 0o644, "plain.md": 0o644}
