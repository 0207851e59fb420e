"""The reports in a real headless browser (Debian's ``chromium``): the index and one notebook report
render to non-blank PNGs. Skipped where chromium is not installed (``apt-get install chromium``).

Also a script, to look at the screenshots of a real run::

    python tests/test_reports_browser.py reports/smoke /tmp/shots     # index.html + every report
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 1800, fragment: str = "") -> Path:
    """Render ``page`` (``#fragment`` appended) headless at ``width`` x ``height`` CSS pixels into ``png``."""
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed (Debian: apt-get install chromium)")
    png.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--allow-file-access-from-files", f"--window-size={width},{height}",
                    f"--screenshot={png}", page.resolve().as_uri() + fragment],
                   check=True, capture_output=True, timeout=120)
    return png


def _ink(png: Path) -> float:
    """Share of pixels that are not (near) white."""
    from PIL import Image

    histogram = Image.open(png).convert("L").histogram()
    return sum(histogram[:200]) / sum(histogram)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_index_and_report_render_in_chromium(tmp_path):
    from test_report import _executed_notebook, _store

    from copes_lib import report

    results, figures = _store(tmp_path)
    png_figure = figures / "smoke" / "08_memory_vs_context.png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 128], [8.68, 12.78])
    fig.savefig(png_figure)
    plt.close(fig)
    reports = tmp_path / "reports" / "smoke"
    reports.mkdir(parents=True)
    executed = _executed_notebook(reports / "08_memory_and_gpu_hours.ipynb")
    record = {"status": "ok", "duration_s": 19.1, "html": "08_memory_and_gpu_hours.html"}
    html_page = report.export_notebook_html(executed, reports / record["html"], "smoke", record=record,
                                            results_root=results, figures_root=figures)
    index = report.render_index("smoke", reports, {"notebooks": {"08_memory_and_gpu_hours": record}},
                                results_root=results, figures_root=figures)
    for page in (index, html_page):
        png = screenshot(page, tmp_path / f"{page.stem}.png", height=900)
        assert png.stat().st_size > 5000
        assert 0.01 < _ink(png) < 0.6, page  # text and a figure, not a blank or a black page
    # the code is hidden by default and shown by the toggle (here through the page's #code address)
    hidden = screenshot(html_page, tmp_path / "hidden.png", height=1400)
    shown = screenshot(html_page, tmp_path / "shown.png", height=1400, fragment="#code")
    assert _ink(shown) > _ink(hidden)


if __name__ == "__main__":
    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    for page in sorted(folder.glob("*.html")):
        print(screenshot(page, out / f"{page.stem}.png", height=int(sys.argv[3]) if len(sys.argv) > 3 else 1800))
