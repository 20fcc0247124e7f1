"""Headless Chromium for the tests that look at pages in a real browser.

The Debian packages `chromium` and `chromium-driver` (no download at run
time). `chromium()` skips the calling test with the reason when either is
missing, and cuts the browser off the network.
"""

import contextlib
import os
import shutil
import tempfile

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu",
    "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
)


@contextlib.contextmanager
def chromium(width=1280, height=1000):
    """A selenium driver of headless Chromium with no network."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER)
               if not os.path.exists(path)]
    if missing:
        pytest.skip(f"headless Chromium needs {', '.join(missing)} (Debian "
                    "packages chromium and chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_network_conditions(offline=True, latency=0,
                                      download_throughput=0,
                                      upload_throughput=0)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
