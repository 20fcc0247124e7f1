"""Headless Chromium for the tests that look at pages in a real browser.

The driver set-up is the benchmarks' own (`scripts/_browser.py`: Debian's
`chromium` and `chromium-driver`, nothing downloaded); `chromium()` here
skips the calling test with the reason when either is missing, and cuts the
browser off the network.
"""

import contextlib
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import _browser  # noqa: E402


@contextlib.contextmanager
def chromium(width=1280, height=1000):
    """A selenium driver of headless Chromium with no network."""
    if not _browser.have_chromium():
        pytest.skip(f"headless Chromium needs {_browser.CHROMIUM} and "
                    f"{_browser.CHROMEDRIVER} (Debian packages chromium and "
                    "chromium-driver)")
    pytest.importorskip("selenium.webdriver")
    driver = _browser.chromium(window_size=(width, height), offline=True)
    try:
        yield driver
    finally:
        driver.quit()
