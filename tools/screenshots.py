"""Write the README's pictures from real JupyterLab in Debian's chromium: the widgets as a learner sees them.

    python tools/screenshots.py [--out docs/images] [--only NAME ...]

Each picture is one row of SHOTS: the notebook, the code cell whose output is photographed, and what
to do to the widget first (a tests/lab_harness.py `Act`, the same table row the browser suite uses).
The notebooks are run with Run All on a scratch copy, exactly as tests/test_browser.py does, so the
pictures change when the widgets do. Adding a picture is one line in SHOTS.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from lab_harness import Act, Lab, act, chromium, shoot  # noqa: E402  (tests/ is a folder, not a package)


@dataclass(frozen=True)
class Shot:
    """docs/images/<png>: the output of the cell of `notebook` whose source contains `cell`, after the
    interactions `then`, in order."""

    png: str
    notebook: str
    cell: str
    then: tuple[Act, ...] = ()


SHOTS = [
    Shot("sampler_playground.png", "07_sampler.ipynb", "pg = SamplerPlayground(yours=",
         (Act("pg = SamplerPlayground(yours=", "slider", "top-k", watch=".tl-token", expect="kept 3 of 5"),)),
    Shot("kv_block_map.png", "04_kv_pool.ipynb", "bm = BlockMap(yours=",
         (Act("bm = BlockMap(yours=", "click", "next", watch=".widget-html", expect="Step 1 of 5"),  # Run All leaves step 0
          Act("bm = BlockMap(yours=", "click", "next", watch=".widget-html"),
          Act("bm = BlockMap(yours=", "type", "position", "9", watch=".tl-where, .tl-message", expect="pool block 2"))),
    Shot("numbers.png", "03_numbers.ipynb", "numbers = NumbersWidget(",
         (Act("numbers = NumbersWidget(", "type", "x =", "0.1", watch=".widget-html", expect="0x2E66"),)),
    Shot("pitfall_lab.png", "10_pitfalls.ipynb", 'lab = PitfallLab("s13")',
         (Act('lab = PitfallLab("s13")', "select", "pitfall", "s18 · Evicting the newest prefix instead of the oldest",
              watch=".tl-diff", expect="last=True"),
          Act('lab = PitfallLab("s13")', "click", "Run its test with the pitfall on", watch=".tl-verdict-box",
              expect="CAUGHT"))),
]


def take(lab: Lab, browser, shots: list[Shot], out: Path) -> list[Path]:
    """Run each notebook of `shots` once and write its pictures into `out`; -> the files written."""
    written = []
    for notebook in dict.fromkeys(s.notebook for s in shots):
        page = lab.open(browser, notebook, viewport={"width": 1400, "height": 2400})
        try:
            lab.run_all(page)
            for s in (s for s in shots if s.notebook == notebook):
                for a in s.then:
                    act(page, a)
                written.append(shoot(page, s.cell, out / s.png))
        finally:
            page.close()
            lab.shutdown_kernels()
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    ap.add_argument("--only", nargs="*", help="PNG names to write (default: all of SHOTS)")
    args = ap.parse_args(argv)
    shots = [s for s in SHOTS if not args.only or s.png in args.only]
    unknown = set(args.only or ()) - {s.png for s in SHOTS}
    if unknown:
        ap.error(f"no such picture: {', '.join(sorted(unknown))}; known: {', '.join(s.png for s in SHOTS)}")
    with tempfile.TemporaryDirectory(prefix="tl_screenshots_") as scratch, Lab(Path(scratch)) as lab, \
            chromium() as browser:
        for path in take(lab, browser, shots, args.out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
