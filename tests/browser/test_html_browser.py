"""The HTML report in a real headless browser: Chromium driven by selenium.

It opens from a file:// URL with the network switched off, logs no console error, draws
every chart with data, runs none of the markup planted in user strings, and a
10,000-step report stays under 5 MB and draws whole (how fast it opens:
``benchmarks/html_open.py``). Skipped, with the reason, where Chromium, chromedriver or
selenium is missing (tests/browser/README says how to install them).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from vramscope.report import html
from vramscope.report.diff import diff_reports, render_html
from vramscope.report.model import Finding, Report

TESTS = Path(__file__).resolve().parents[1]
DATA = TESTS / "data"
INSTALL = (
    "apt-get install -y chromium chromium-driver && pip install selenium (see tests/browser/README)"
)
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(f"needs Chromium and chromedriver: {INSTALL}", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason=f"needs selenium: {INSTALL}")
# one worker runs this module (`--dist loadgroup`): one Chromium for its tests
pytestmark = pytest.mark.xdist_group("browser")

FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1360,900",
)
CHARTS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (gd) {
  var points = 0;
  gd.data.forEach(function (t) { points += (t.x || t.values || t.y || []).length; });
  return {id: gd.id, traces: gd.data.length, points: points,
          drawn: gd.querySelectorAll('.main-svg').length};
});
"""


def start_browser(profile: Path):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    return driver


def open_report(driver, path: Path, timeout_s: float = 30.0, fragment: str = "") -> dict:
    """Open ``path`` and wait until every chart is drawn; the page's own timings (ms)."""
    driver.get_log("performance")  # forget earlier requests
    if fragment:
        driver.get("about:blank")  # or a new fragment only scrolls the page already open
    driver.get(path.as_uri() + fragment)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = driver.execute_script("return [window.vramscopeReady, window.vramscopeError]")
        if state[0] or state[1]:
            break
        time.sleep(0.02)
    assert state[1] is None, f"the page reported: {state[1]}"
    assert state[0], f"the charts were not drawn within {timeout_s} s"
    timings = driver.execute_script(
        "var n = performance.getEntriesByType('navigation')[0];"
        "return Object.assign({content: n.domContentLoadedEventEnd}, window.vramscopeTimings);"
    )
    return timings


def requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_browser(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def gpt_page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pages") / "report_h200_gpt.html"
    html.write(Report.load(DATA / "report_h200_gpt.json"), path)
    return path


def test_the_report_loads_offline_with_no_console_error(browser, gpt_page):
    open_report(browser, gpt_page)
    urls = requested_urls(browser)
    assert urls and all(u.startswith(("file://", "data:", "blob:")) for u in urls), urls
    assert console_errors(browser) == []
    assert browser.execute_script("return typeof Plotly") == "object"


def test_every_chart_is_drawn_with_data(browser, gpt_page):
    open_report(browser, gpt_page)
    charts = {c["id"]: c for c in browser.execute_script(CHARTS)}
    expected = {
        "chart-timeline",
        "chart-categories",
        "chart-waterfall-peak",
        "chart-waterfall-end",
        "chart-device-peak",
        "chart-device-end",
        "chart-phases",
        "chart-steps",
    }
    assert set(charts) == expected
    for chart in charts.values():
        assert chart["traces"] > 0 and chart["points"] > 0 and chart["drawn"] > 0, chart
    assert browser.execute_script("return document.querySelectorAll('.plotly .trace').length") > 10


def test_the_first_screen_is_drawn_first_then_the_rest(browser, gpt_page):
    opened = open_report(browser, gpt_page)
    drawn = {k: v for k, v in opened.items() if k.startswith("chart-")}
    assert min(drawn, key=drawn.get) == "chart-timeline"
    assert opened["chart-timeline"] <= opened["first"] < opened["chart-steps"]
    # "plotted" is taken when the last chart is drawn (the browser's clock is coarsened)
    assert abs(opened["plotted"] - max(drawn.values())) <= 1.0
    # opened at the steps: that chart is on screen, so it is drawn with the first screen
    at_steps = open_report(browser, gpt_page, fragment="#steps")
    assert at_steps["chart-steps"] <= at_steps["first"] < at_steps["chart-categories"]
    assert at_steps["chart-timeline"] <= at_steps["first"]


def test_markup_in_user_strings_never_runs(browser, tmp_path):
    report = Report.load(DATA / "report_h200_gpt.json")
    attack = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
    report.workload["spec"] = attack
    report.device["name"] = attack
    report.findings.append(Finding("leak", "warning", attack))
    report.modules = [{"name": "", "parameters_bytes": 10}, {"name": attack, "parameters_bytes": 5}]
    report.extra["fit"] = {"strategies": [{"name": attack, "peak": {"allocated_bytes": 5}}]}
    path = tmp_path / "attack.html"
    html.write(report, path)
    open_report(browser, path)
    assert browser.execute_script("return window.__xss") is None
    assert attack in browser.find_element("tag name", "h1").text  # shown as text
    treemap = browser.execute_script(
        "return document.getElementById('chart-modules').querySelector('.treemaplayer').textContent"
    )
    assert "<img" in treemap  # plotly draws the name as text, not markup


def test_modules_estimates_and_fit_sections_draw(browser, tmp_path):
    report = Report.load(DATA / "report_h200_gpt.json")
    report.kind = "estimated"
    report.modules = [
        {"name": "", "parameters_bytes": 20 * 2**20, "activations_bytes": 40 * 2**20},
        {"name": "blocks.0", "parameters_bytes": 8 * 2**20, "activations_bytes": 20 * 2**20},
        {"name": "blocks.1", "parameters_bytes": 8 * 2**20, "activations_bytes": 20 * 2**20},
    ]
    report.extra["verdict"] = {"fits": False, "headroom_bytes": -2 * 2**30}
    report.extra["validation"] = {
        "estimated": {"allocated_bytes": 800 * 2**20},
        "measured": {"allocated_bytes": 774 * 2**20},
    }
    report.extra["fit"] = {
        "max_batch_size": 24,
        "strategies": [{"name": "baseline", "peak": {"allocated_bytes": 2**30}}],
        "curve": [{"batch_size": b, "peak": {"allocated_bytes": b * 2**27}} for b in (8, 16, 24)],
    }
    path = tmp_path / "estimate.html"
    html.write(report, path)
    open_report(browser, path)
    charts = {c["id"]: c for c in browser.execute_script(CHARTS)}
    for chart in ("chart-modules", "chart-validation", "chart-strategies", "chart-fit-curve"):
        assert charts[chart]["points"] > 0 and charts[chart]["drawn"] > 0, chart
    assert console_errors(browser) == []
    assert "Does not fit" in browser.find_element("id", "verdict").text


def test_the_diff_page_draws(browser, tmp_path):
    a, b = Report.load(DATA / "report_h200_gpt.json"), Report.load(DATA / "report_h200_leak.json")
    path = tmp_path / "diff.html"
    path.write_text(render_html(diff_reports(a, b, "gpt.json", "leak.json"), a, b))
    open_report(browser, path)
    charts = browser.execute_script(CHARTS)
    assert len(charts) >= 4 and all(c["points"] > 0 for c in charts)
    assert console_errors(browser) == []


def test_the_screenshot_is_not_blank(browser, gpt_page, tmp_path):
    open_report(browser, gpt_page)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1360, min(height, 7000))
    time.sleep(0.5)  # charts resize to the new window
    png = tmp_path / "report.png"
    assert browser.save_screenshot(str(png))
    browser.set_window_size(1360, 900)
    print(f"\nscreenshot: {png}")
    try:
        from PIL import Image
    except ImportError:  # without pillow, a blank page compresses to a few KiB
        assert png.stat().st_size > 100_000
        return
    image = Image.open(png).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 500  # text, charts, cards
    assert len(image.resize((64, 64)).getcolors(maxcolors=4096) or []) > 20


def test_a_10000_step_report_is_light_and_draws_whole(tmp_path):
    """A 10,000-step run: under 5 MB, every chart drawn, no console error. How fast it
    opens is a benchmark (``benchmarks/html_open.py``), not a test."""
    sys.path.insert(0, str(TESTS))
    from test_html import long_report

    path = tmp_path / "long.html"
    html.write(long_report(10_000), path)
    assert path.stat().st_size < 5_000_000
    driver = start_browser(tmp_path / "profile")
    try:
        open_report(driver, path)
        charts = driver.execute_script(CHARTS)
        assert console_errors(driver) == []
    finally:
        driver.quit()
    assert charts and all(c["points"] > 0 and c["drawn"] for c in charts)
