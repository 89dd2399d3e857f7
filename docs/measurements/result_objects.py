"""What 1,000 results cost in Python alone, with no communication: the floor
under the functional coalesced forms, which must hand back one result object
per array (torch's signature) and which a caller then reads one by one.

In one process: making 1,000 views of one buffer, wrapping each in an
AsyncArray (already complete), and reading each through wait_tensor and
np.asarray, as docs/measurements/coalesced_forms.py reads them; best of 5
repeats of 20. A measurement for docs/benchmarks.md, not part of pycoll:

    python docs/measurements/result_objects.py
"""

import timeit

import numpy as np

from pycoll import functional as F

K, C = 1000, 256  # arrays, float32 elements each (1 KiB)
flat = np.zeros(K * C, np.float32)
views = [flat[i * C : (i + 1) * C].reshape(C) for i in range(K)]
results = [F.AsyncArray([], v, v.shape, None) for v in views]
assert all(np.asarray(F.wait_tensor(y)) is v for y, v in zip(results, views))

cases = {
    "views of one buffer": lambda: [flat[i * C : (i + 1) * C].reshape(C) for i in range(K)],
    "AsyncArray per view": lambda: [F.AsyncArray([], v, v.shape, None) for v in views],
    "read each (wait_tensor, asarray)": lambda: [np.asarray(F.wait_tensor(y)) for y in results],
}
total = 0.0
for name, call in cases.items():
    us = min(timeit.repeat(call, number=20, repeat=5)) / 20 * 1e6
    total += us
    print(f"{name:36s} {us:8.0f} us per {K}")
print(f"{'together':36s} {total:8.0f} us per {K}")
