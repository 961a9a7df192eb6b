"""The reference workload reads scikit-learn's bundled digits without importing sklearn; it must be
exactly the data `sklearn.datasets.load_digits()` returns."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
from sklearn.datasets import load_digits as sklearn_load_digits

from tests.conftest import ROOT


def test_bundled_digits_are_sklearns_digits():
    spec = importlib.util.spec_from_file_location("digits_train", ROOT / "examples" / "digits" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["digits_train"] = module
    spec.loader.exec_module(module)
    images, targets = module.load_digits()
    reference = sklearn_load_digits()
    assert np.array_equal(images, reference.data) and np.array_equal(targets, reference.target)
