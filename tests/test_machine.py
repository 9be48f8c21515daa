"""tl_lab/ops/machine.py: what the machine is and how fast it reads memory (chapter L10.1, section 2.4)."""

import os
from pathlib import Path

import numba
import numpy as np
import pytest

from tl_lab.ops import machine
from tl_lab.ops.lanes import LANES


def test_describe_names_the_processor_its_llvm_name_its_features_cores_and_caches():
    d = machine.describe()
    assert d["cpu_model"] and d["llvm_host_cpu"] and d["numba_target_cpu"]
    assert d["cores"] == len(os.sched_getaffinity(0))
    assert set(d["isa"]) <= set(machine.FEATURES)
    flags = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    assert ("avx2" in d["isa"]) == (" avx2" in flags)
    if Path("/sys/devices/system/cpu/cpu0/cache").is_dir():
        assert "L1d" in d["caches"] and d["caches"]["L1d"].endswith("KB")


def test_describe_says_how_the_kernels_threads_wait_set_or_not(monkeypatch):
    for name in machine.POOL_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    assert machine.describe()["kernel_pool"] == machine.POOL_DEFAULTS  # a process started from here uses these
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    assert machine.describe()["kernel_pool"] == {**machine.POOL_DEFAULTS, "GOMP_SPINCOUNT": "0"}  # the user's wins


def test_the_kernels_apply_the_pool_defaults():
    from tl_lab.ops import kernels  # noqa: F401 (importing it sets them where the user did not)

    for name in machine.POOL_DEFAULTS:
        assert os.environ.get(name), f"{name} unset after importing the kernels"


def test_cache_sizes_are_the_systems():
    sysfs = Path("/sys/devices/system/cpu/cpu0/cache")
    if not sysfs.is_dir():
        pytest.fail("this test reads Linux's sysfs cache description, which this system does not have")
    for d in sysfs.glob("index*"):
        if (d / "level").read_text().strip() == "1" and (d / "type").read_text().strip() == "Data":
            assert machine.cache_bytes(1) == machine._size((d / "size").read_text())
    assert machine._size("48K") == 48 * 1024 and machine._size("2M") == 2 * 2**20 and machine._size("512") == 512
    assert machine.cache_bytes(9) is None


def test_read_bandwidth_is_measured_and_the_thread_count_restored(monkeypatch):
    before = numba.get_num_threads()
    monkeypatch.setattr(machine, "read_megabytes", lambda last: pytest.fail("a size given was replaced"))
    gbps = machine.read_gbps(1, rounds=1, megabytes=16)
    assert 0.1 < gbps < 10_000 and numba.get_num_threads() == before


def test_the_fma_peak_is_measured_on_each_thread_and_the_thread_count_restored():
    before = numba.get_num_threads()
    gflops = machine.fma_gflops(numba.config.NUMBA_NUM_THREADS, rounds=1, steps=1000)
    assert 0.1 < gflops < 100_000 and numba.get_num_threads() == before
    x = np.full((2, LANES), 0.5, dtype=np.float32)
    out = np.zeros(3, dtype=np.float32)
    machine._FMA[0](x, 1000, out)
    assert out.tolist() == [machine.CHAINS * LANES * 1000 * 0.25] * 3  # every multiply-add counted was done, on each share


def test_the_rates_are_the_work_done_over_the_best_seconds(monkeypatch):
    monkeypatch.setattr(machine, "_best_seconds", lambda threads, rounds, call: (call(), 0.5)[1])
    assert machine.read_gbps(1, megabytes=8) == 8 * 2**20 / 0.5 / 1e9
    n = numba.config.NUMBA_NUM_THREADS
    assert machine.fma_gflops(n, steps=10) == machine.CHAINS * LANES * 2 * 10 * n / 0.5 / 1e9


def test_best_seconds_is_the_shortest_timed_call_after_an_untimed_one_on_the_threads_asked(monkeypatch):
    before = numba.get_num_threads()
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # three timed calls: 3, 1 and 2 s
    monkeypatch.setattr(machine.time, "perf_counter", lambda: next(ticks))
    seen = []
    assert machine._best_seconds(1, 3, lambda: seen.append(numba.get_num_threads())) == 1.0
    assert seen == [1, 1, 1, 1] and numba.get_num_threads() == before


def test_describe_says_what_the_system_leaves_out(monkeypatch):
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {})
    d = machine.describe()
    assert d["cpu_family_model"] == "?/?" and d["isa"] == []


CPUINFO = """processor\t: 0
vendor_id\t: Test:Vendor
model name\t: Test CPU
cpu family\t: 25
model\t\t: 17
flags\t\t: fpu sse4_2 avx avx2 fma avx512f

processor\t: 1
model name\t: Another CPU
flags\t\t: fpu
"""
CACHES = [{"level": 1, "type": "Data", "bytes": 32 << 10, "shared_by": 1},
          {"level": 1, "type": "Instruction", "bytes": 64 << 10, "shared_by": 1},
          {"level": 2, "type": "Unified", "bytes": 1 << 20, "shared_by": 1},
          {"level": 3, "type": "Unified", "bytes": 32 << 20, "shared_by": 16}]


def test_the_first_processors_block_is_the_one_read():
    info = machine._first_processor(CPUINFO)
    assert info["model name"] == "Test CPU" and info["model"] == "17" and "avx2" in info["flags"].split()
    assert info["vendor_id"] == "Test:Vendor"  # split at the first colon: a value may hold one


def test_sizes_in_every_unit():
    assert [machine._size(t) for t in ("48K", "2M", "2G", "512\n")] == [48 << 10, 2 << 20, 2 << 30, 512]


def test_describe_reads_a_described_machine(monkeypatch):
    """describe() on a given /proc/cpuinfo block and cache list: the fields it builds from them."""
    monkeypatch.setattr(machine, "_cpuinfo", lambda: machine._first_processor(CPUINFO))
    monkeypatch.setattr(machine, "caches", lambda: CACHES)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setenv("NUMBA_CPU_NAME", "znver3")
    d = machine.describe()
    assert d["cpu_model"] == "Test CPU" and d["cpu_family_model"] == "25/17"
    assert d["isa"] == ["sse4_2", "avx", "avx2", "fma", "avx512f"]
    assert d["caches"] == {"L1d": "32 KB", "L1i": "64 KB", "L2": "1024 KB", "L3": "32768 KB shared by 16"}
    assert d["cores"] == 1 and d["env"]["NUMBA_CPU_NAME"] == "znver3"
    assert machine.cache_bytes(1) == 32 << 10 and machine.cache_bytes(2) == 1 << 20
    assert machine.cache_bytes(1, "Instruction") == 64 << 10 and machine.cache_bytes(4) is None
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {"Features": "fp asimd sve"})  # an Arm processor's key
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS has none: the CPU count
    d = machine.describe()
    assert d["isa"] == ["asimd", "sve"] and d["cores"] == os.cpu_count()


def test_read_bandwidth_by_default_sizes_its_buffer_by_the_largest_cache(monkeypatch):
    """Without a size, the buffer comes from the largest cache the system lists (`read_megabytes`)."""
    asked = []
    monkeypatch.setattr(machine, "caches", lambda: CACHES)
    monkeypatch.setattr(machine, "read_megabytes", lambda last: asked.append(last) or 8)
    assert machine.read_gbps(1, rounds=1) > 0 and asked == [32 << 20]


def test_describe_records_each_setting_that_changes_the_kernels(monkeypatch):
    """The environment a figure was measured under: numba's target, OpenBLAS's kernels, how the
    kernels' threads wait; each recorded where set, none made up where not."""
    names = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    for k, name in enumerate(names):
        monkeypatch.setenv(name, f"value {k}")
    assert machine.describe()["env"] == {name: f"value {k}" for k, name in enumerate(names)}
    for name in names:
        monkeypatch.delenv(name)
    assert machine.describe()["env"] == {}


def test_the_read_buffer_is_twice_the_last_cache_within_256_mb_and_1_gb():
    assert [machine.read_megabytes(b) for b in (0, 32 << 20, 300 << 20, 4 << 30)] == [256, 256, 600, 1024]
    assert isinstance(machine.read_megabytes(300 << 20 | 1), int)
