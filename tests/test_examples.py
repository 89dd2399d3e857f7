"""The data-parallel example: loss falls and every rank ends with the same weights."""

import importlib.util
import os
import sys

import numpy as np

import pycoll

HERE = os.path.dirname(__file__)


def load_example(name="data_parallel"):
    path = os.path.join(HERE, "..", "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pycoll.rpc pickles its functions by module name
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


def test_rpc_parameter_server_converges(rank, world_size):
    """Every rank trains against worker0's weights through pycoll.rpc; all end
    with worker0's final weights, which fit every rank's shard."""
    example = load_example("rpc_parameter_server")
    result = example.train(steps=60)
    assert result["final_loss"] < result["loss"][0] / 100, (result["loss"][0], result["final_loss"])
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, result["weights"])
    for w in everyone:
        np.testing.assert_array_equal(w, everyone[0])
