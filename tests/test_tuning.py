"""tl_lab/tuning.py: the process tuning the runner asks for at load (lab test, not graded)."""


def test_keep_freed_memory_tunes_glibc_and_only_glibc():
    """On glibc the runner asks malloc to keep large freed blocks (both mallopt calls accepted);
    elsewhere it says it did nothing, and nothing fails."""
    import platform

    from tl_lab.tuning import keep_freed_memory

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")
