"""tl_lab/errors.py: the refusals every module raises, their messages clipped (interface page, "Errors")."""

from tl_lab.errors import MAX_MESSAGE, BatchError, ConfigError, FormatError, KvError, TlError, clip


def test_a_long_message_keeps_its_two_ends_and_counts_the_middle():
    assert clip("short") == "short" and clip("x" * MAX_MESSAGE) == "x" * MAX_MESSAGE
    text = "a" * 600 + "b" * 1000 + "c" * 600
    clipped = clip(text)
    assert clipped == "a" * 500 + " ...[1,200 characters left out]... " + "c" * 500
    assert clip("0123456789", limit=4) == "01 ...[6 characters left out]... 89"


def test_every_refusal_is_a_tl_error_with_its_text_clipped():
    for kind in (FormatError, ConfigError, KvError, BatchError):
        err = kind("n" * 5000, 7)
        assert isinstance(err, TlError) and err.args == (clip("n" * 5000), 7)  # only text is clipped
        assert len(str(err.args[0])) < MAX_MESSAGE + 50
