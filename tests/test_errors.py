"""tl_lab/errors.py: the refusals every module raises, their messages clipped (interface page, "Errors")."""

from tl_lab.errors import MAX_MESSAGE, BatchError, ConfigError, FormatError, KvError, TlError, clip, one_line


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


def test_a_message_with_line_breaks_is_written_on_one_line():
    """A message quotes what a user or a file gave; the command line says it as one line."""
    text = "a\nerror: b\r\nc\x0bd\x0ce\x1cf\x85g\u2028h\u2029i"
    assert one_line(text) == "a\\nerror: b\\r\\nc\\x0bd\\x0ce\\x1cf\\x85g\\u2028h\\u2029i"
    assert len(one_line(text).splitlines()) == 1 and one_line("plain: tab\tstays") == "plain: tab\tstays"
