"""The data-parallel example: loss falls and every rank ends with the same weights."""

import importlib.util
import os
import sys

import numpy as np

import pycoll

HERE = os.path.dirname(__file__)


EXAMPLES = os.path.join(HERE, "..", "examples")


def load_example(name="data_parallel"):
    """The example ``name`` as a module, its folder on the path as running
    it puts it there (the parameter server's takes the data-parallel
    example's shards)."""
    if EXAMPLES not in sys.path:
        sys.path.append(EXAMPLES)
    path = os.path.join(EXAMPLES, f"{name}.py")
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
    with worker0's final weights, which fit every rank's shard 100 times
    better than the starting weights did. (Not better than this rank's first
    observed loss: on a busy machine a rank may start after the others have
    nearly trained the weights, and first see them almost fitted.)"""
    example = load_example("rpc_parameter_server")
    result = example.train(steps=60)
    x, y = example.shard(rank)
    start = np.random.default_rng(7).normal(size=example.FEATURES).astype(np.float32)
    initial = float(np.mean((x @ start - y) ** 2))  # the ParameterServer's starting weights
    assert result["final_loss"] < initial / 100, (initial, result["loss"][0], result["final_loss"])
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, result["weights"])
    for w in everyone:
        np.testing.assert_array_equal(w, everyone[0])
