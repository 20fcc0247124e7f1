"""How fast the Attention dashboard serves and draws large maps.

Writes two runs with the summary API (no training): `a-heads` with 8 heads
of 512 x 512 and `b-long` with one head of 2048 x 2048 (float16, one probe
example each), starts TensorBoard with the plugin on them, and measures:

* the data route, from Python: `meta` + `weights` of one step (the bytes
  the dashboard fetches for a view), and as a peer in the same run the
  plugin's static `index.js` (what any request to this server costs);
* the first render, in headless Chromium: from opening the dashboard until
  the 8-head view is drawn (module load, run listing, both routes, float16
  decode, painting and labels), and from picking the long run until its map
  is drawn (max-pooled to screen size); each in a fresh page, so no map is
  cached.

Each figure is the median of `--rounds` rounds. Goal: the 8-head first
render under one second.

Usage:

    python scripts/bench_dashboard.py            # ~1 minute
    python scripts/bench_dashboard.py --rounds 7

Needs /usr/bin/chromium and /usr/bin/chromedriver (Debian packages chromium
and chromium-driver). Bad arguments exit with status 2 and one line on
stderr.
"""

import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import _bench  # first: backend, log level, sys.path
import _browser
import numpy as np
from _bench import add_flag

from keras_attention.events import SummaryWriter
from keras_attention.viz import write_attention_summary
from keras_attention.viz.summary import summary_tag

PROG = "bench_dashboard.py"
CASES = {"a-heads": (8, 512), "b-long": (1, 2048)}
GOAL_SECONDS = 1.0
TAG = summary_tag("attention_0")


def parse_args(argv=None):
    parser = _bench.parser(PROG, "Data route and first-render times of the "
                           "Attention dashboard for large maps.")
    add_flag(parser, "--rounds", 5, "rounds per figure; the median counts "
             "(default 5)")
    add_flag(parser, "--steps", 3, "steps logged per run (default 3)")
    return parser.parse_args(argv)


def write_runs(logdir, steps):
    rng = np.random.default_rng(0)
    for run, (heads, length) in CASES.items():
        labels = [f"t{i}" for i in range(length)]
        with SummaryWriter(os.path.join(logdir, run)) as writer:
            for step in range(steps):
                scores = rng.normal(0, 2, (1, heads, length, length)).astype(
                    np.float32)
                weights = np.exp(scores - scores.max(-1, keepdims=True))
                weights /= weights.sum(-1, keepdims=True)
                write_attention_summary("attention_0", {"weights": weights,
                                                        "scores": scores},
                                        step, labels,
                                        target_cells=[[(length - 1, 0)]],
                                        writer=writer)


def timed_get(url):
    start = time.perf_counter()
    body = urllib.request.urlopen(url, timeout=60).read()
    return time.perf_counter() - start, len(body)


def route_times(base, rounds):
    """`{case: (median seconds, bytes)}` of meta + weights, and the peer."""
    results = {}
    for run in CASES:
        params = urllib.parse.urlencode({"run": run, "tag": TAG, "step": 0})
        times, size = [], 0
        for _ in range(rounds):
            meta = timed_get(f"{base}/data/plugin/attention/meta?{params}")
            data = timed_get(f"{base}/data/plugin/attention/weights?{params}"
                             f"&example=0")
            times.append(meta[0] + data[0])
            size = meta[1] + data[1]
        results[run] = (statistics.median(times), size)
    peer = [timed_get(f"{base}/data/plugin/attention/index.js")
            for _ in range(rounds)]
    results["peer: index.js"] = (statistics.median(t for t, _ in peer),
                                 peer[0][1])
    return results


_DRAWN = ("const r = document.querySelector('#root');"
          "return r ? r.dataset.ready || null : null;")
# Picks the long run and calls back with the milliseconds until it is drawn.
_PICK_LONG = """
const [run, done] = arguments;
const root = document.querySelector('#root');
const before = root.dataset.ready;
const start = performance.now();
const menu = document.querySelector('#run');
menu.value = run;
menu.dispatchEvent(new Event('change'));
const wait = () => root.dataset.ready !== before
  && document.querySelector('canvas.heat')
  ? done(performance.now() - start) : requestAnimationFrame(wait);
wait();
"""


def render_times(driver, base, rounds):
    """Median seconds of the first 8-head render and of the long map."""
    from selenium.webdriver.support.ui import WebDriverWait

    entry = base + "/data/plugin_entry.html?name=attention"
    heads, long = [], []
    driver.set_script_timeout(120)
    for _ in range(rounds):
        driver.get("about:blank")
        start = time.perf_counter()
        driver.get(entry)
        WebDriverWait(driver, 120, poll_frequency=0.01).until(
            lambda d: d.execute_script(_DRAWN))
        heads.append(time.perf_counter() - start)
        panels = len(driver.find_elements("css selector", "canvas.heat"))
        if panels != CASES["a-heads"][0]:
            _bench.fail(PROG, f"the 8-head view drew {panels} maps")
        long.append(driver.execute_async_script(_PICK_LONG, "b-long") / 1e3)
    return statistics.median(heads), statistics.median(long)


def main(argv=None):
    args = parse_args(argv)
    if not _browser.have_chromium():
        _bench.fail(PROG, f"needs {_browser.CHROMIUM} and "
                    f"{_browser.CHROMEDRIVER} (apt-get install chromium "
                    f"chromium-driver)")
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as logdir:
        _bench.note("writing the runs")
        write_runs(logdir, args.steps)
        _bench.note("starting TensorBoard")
        try:
            server, base = _browser.start_tensorboard(logdir, len(CASES))
        except RuntimeError as error:
            _bench.fail(PROG, error)
        try:
            routes = route_times(base, args.rounds)
            driver = _browser.chromium()
            try:
                heads, long = render_times(driver, base, args.rounds)
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(10)
    print(f"{os.cpu_count()} CPU(s); medians of {args.rounds} rounds; "
          f"float16 weights, {args.steps} steps a run")
    rows = [[name, f"{seconds * 1e3:.1f}", f"{size / 1e6:.2f}"]
            for name, (seconds, size) in routes.items()]
    print(_bench.text_table(["data route (meta + weights, one step)", "ms",
                             "MB"], rows, header_justify="left"))
    print()
    print(_bench.text_table(
        ["first render in headless Chromium", "s"],
        [["8 heads x 512 x 512 (page open -> drawn)", f"{heads:.3f}"],
         ["1 head x 2048 x 2048 (run picked -> drawn)", f"{long:.3f}"]],
        header_justify="left"))
    verdict = "met" if heads < GOAL_SECONDS else "NOT met"
    print(f"goal 8-head first render < {GOAL_SECONDS:.0f} s: {heads:.3f} s "
          f"({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
