"""tl_lab/machine.py: what the machine is and how fast it reads memory (chapter L10.1, section 2.4)."""

import os
from pathlib import Path

import numba
import pytest

from tl_lab import machine


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
    from tl_lab import kernels  # noqa: F401 (importing it sets them where the user did not)

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


def test_read_bandwidth_is_measured_and_the_thread_count_restored():
    before = numba.get_num_threads()
    gbps = machine.read_gbps(1, rounds=1, megabytes=16)
    assert 0.1 < gbps < 10_000 and numba.get_num_threads() == before
