"""What every widget shares: the monospace style and the way a widget says something in words."""

from __future__ import annotations

import html

MONO = "font-family: ui-monospace, monospace"
ERROR = "#c0392b"   # a refusal or an input out of range
NOTE = "#555"       # a normal state worth a sentence ("no sequence holds blocks now")


def message(text: str, colour: str = ERROR) -> str:
    """One line of HTML in words, escaped; red by default, `NOTE` grey for a normal state."""
    return f"<p class='tl-message' style='color:{colour}'><b>{html.escape(text)}</b></p>"
