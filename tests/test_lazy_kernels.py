"""tl_lab.ops.lazy_kernels: reading a checkpoint imports no compiler; the products are the kernels' own."""

import math
import subprocess
import sys

import numpy as np

from tl_lab.ops import kernels, lazy_kernels
from tl_lab.ops.paths import REPO_ROOT
from tl_lab.ops.q8 import Q8Linear
from tl_lab.quant import _F16_TABLE, QLinear


def test_reading_modules_import_no_compiler():
    """`model` and `quant` (config.json, the safetensors reader, int4) load without numba or llvmlite:
    importing them used to cost 0.4 s and 75 MB here before a file could be refused (issue 20)."""
    code = ("import sys\nimport tl_lab.model, tl_lab.quant, tl_lab.engine.tokenizer, tl_lab.sample\n"
            "print(sorted(m for m in ('numba', 'llvmlite', 'tl_lab.ops.kernels') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_the_products_are_the_kernels_bit_for_bit():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 64), dtype=np.float32)
    W = rng.standard_normal((24, 64), dtype=np.float32)
    assert np.array_equal(lazy_kernels.product_f32(x, W).view(np.uint32), kernels.product_f32(x, W).view(np.uint32))
    q = QLinear.quantize(W, 32)
    args = (q.planar, q.scales, _F16_TABLE)
    assert np.array_equal(lazy_kernels.product_q4(x, *args).view(np.uint32), kernels.product_q4(x, *args).view(np.uint32))


def test_the_int8_head_and_the_samplers_exp_are_the_kernels_and_math_exp():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64), dtype=np.float32)
    head = Q8Linear.quantize(rng.standard_normal((40, 64), dtype=np.float32), group=32)
    args = (head.q, head.scales, _F16_TABLE)
    assert np.array_equal(lazy_kernels.product_q8(x, *args).view(np.uint32), kernels.product_q8(x, *args).view(np.uint32))
    z = rng.standard_normal((2, 5)) * 30
    e = lazy_kernels.exp_f64(z)
    assert e.shape == (2, 5) and e.dtype == np.float64
    assert e.tolist() == [[math.exp(v) for v in row] for row in z.tolist()]
    z32 = z.astype(np.float32)  # taken as float64 first: the exp of each float32 value, in float64
    e32 = lazy_kernels.exp_f64(z32)
    assert e32.dtype == np.float64 and e32.tolist() == [[math.exp(v) for v in row] for row in z32.astype(np.float64).tolist()]


def test_the_kernels_are_imported_at_the_first_call_and_held(monkeypatch):
    """A fresh process's first product imports tl_lab.ops.kernels and keeps it for the next."""
    monkeypatch.setattr(lazy_kernels, "_kernels", None)
    x = np.ones((1, 16), np.float32)
    assert np.array_equal(lazy_kernels.product_f32(x, np.ones((2, 16), np.float32)), [[16.0, 16.0]])
    assert lazy_kernels._kernels is kernels
