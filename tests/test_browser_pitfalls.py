"""The pitfall lab in real JupyterLab in Debian's chromium: pick a pitfall, run its test, see it fail.

The server, the browser and "open and run all" are tests/test_browser.py's fixtures and helpers
(recipe: ../shared/recipes/jupyterlab-in-chromium.md).
"""

import pytest

from test_browser import _errors, _open_and_run_all, browser, lab  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.browser

VERDICT = "CAUGHT: test_run_once_returns_its_blocks FAILS with s17 on"


def test_pitfall_lab_runs_a_test_and_shows_it_caught_in_the_browser(lab, browser):  # noqa: F811
    """Pick s17 in the lab's dropdown and press its red button: the kernel runs the test in a
    subprocess with the pitfall on, and the failing verdict with its assertion must appear in the
    widget (only a wired picker and button can show it: the lab starts on s13, not run)."""
    page = _open_and_run_all(browser, lab, "10_pitfalls.ipynb")
    assert not [e for e in _errors(page) if "Error" in e], _errors(page)
    widget = page.locator(".widget-vbox").filter(has=page.locator("select")).first  # the lab, outermost
    widget.scroll_into_view_if_needed()
    assert "Not run yet" in widget.inner_text()
    widget.locator("select").select_option(label="s17 · Not giving temporary blocks back")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.widget-html')].some(e => e.textContent.includes("
        "'the pool drains a little per embedding call'))", timeout=30_000)
    widget.locator("button", has_text="Run its test with the pitfall on").click()
    page.wait_for_function(
        f"() => [...document.querySelectorAll('.widget-html .tl-verdict')].some(e => e.textContent.includes({VERDICT!r}))",
        timeout=120_000)
    assert VERDICT in widget.locator(".tl-verdict").text_content()
    failure = widget.locator(".tl-failure").text_content()
    assert "assert" in failure and "free" in failure  # the test's own message: blocks not free after run_once
    page.close()
