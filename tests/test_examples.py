"""The data-parallel example: loss falls and every rank ends with the same weights."""

import importlib.util
import os

import numpy as np

import pycoll

HERE = os.path.dirname(__file__)


def load_example():
    path = os.path.join(HERE, "..", "examples", "data_parallel.py")
    spec = importlib.util.spec_from_file_location("data_parallel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_converges_with_identical_weights(rank, world_size):
    result = load_example().train(steps=60, lr=0.1)
    loss = result["loss"]
    assert loss[-1] < loss[0] / 100, (loss[0], loss[-1])
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, result["weights"])
    for w in everyone:
        np.testing.assert_array_equal(w, everyone[0])
