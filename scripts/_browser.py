"""The Attention dashboard under a real browser, for `bench_dashboard.py`
and `tests/test_dashboard.py`: TensorBoard with the plugin on a logdir, and
Debian's headless Chromium through its chromedriver (nothing downloaded).

Imports no project module and no framework, so a test can use it as well.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Headless, and quiet: no network of its own, no first-run or sync work.
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu",
    "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
)


def have_chromium():
    """Whether Debian's chromium and chromium-driver are installed."""
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def chromium(downloads=None, window_size=(1400, 1000), offline=False):
    """A selenium driver of headless Chromium with a fresh profile (removed
    when the driver quits); downloads go to `downloads` when given, and
    `offline=True` cuts the page off the network (a self-contained page must
    render without it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={window_size[0]},{window_size[1]}")
    options.add_argument(f"--user-data-dir={profile}")
    if downloads is not None:
        options.add_experimental_option("prefs", {
            "download.default_directory": str(downloads),
            "download.prompt_for_download": False,
            # Else a page's second download waits for a permission prompt.
            "profile.default_content_setting_values.automatic_downloads": 1,
        })
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    quit_driver = driver.quit

    def quit_and_clean():
        quit_driver()
        shutil.rmtree(profile, ignore_errors=True)

    driver.quit = quit_and_clean
    if offline:
        driver.set_network_conditions(offline=True, latency=0,
                                      download_throughput=0,
                                      upload_throughput=0)
    return driver


def start_tensorboard(logdir, runs, stderr=subprocess.DEVNULL, timeout=120):
    """TensorBoard with the Attention dashboard on `logdir`, once its
    listing holds `runs` runs.

    Returns:
        `(process, base URL)`.

    Raises:
        RuntimeError: if TensorBoard exits or does not list the runs in
            `timeout` seconds.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = os.pathsep.join(
        [REPO_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_attention.viz.tensorboard_plugin",
         "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=stderr,
        env={**os.environ, "PYTHONPATH": path})
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while True:
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            raise RuntimeError(f"TensorBoard did not list {runs} runs of "
                               f"{logdir}")
        try:
            tags = json.load(urllib.request.urlopen(
                base + "/data/plugin/attention/tags", timeout=2))
            if len(tags) >= runs:
                return process, base
        except OSError:
            pass
        time.sleep(0.3)
