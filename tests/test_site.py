"""The instructor's site, opened in headless Chromium: the index and every lecture page load, offline,
and their figures render.

The pages are rendered (helpers.site.write_site) from the notebooks tests/test_notebooks.py executed
in this session, so `make test` executes each lecture once; run alone, this test executes them itself
(SMOKE, a few minutes). Without a Chromium it skips and says why (.ci/run installs Debian's chromium).

Each page is opened once with every host name unresolvable (the CDN scripts for the widgets fail as
they would offline; the maths is MathML, made when the page was built, and needs no script). A small
script injected into a copy of the page reports, at the load event, what the browser made of it;
--dump-dom brings that report back and --screenshot a picture.
"""
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import site

LECTURES = site.lectures()
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--window-size=1280,1600"]
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")

# Runs first in the page; at the load event it writes what it found into <pre id="site-probe">.
PROBE = r"""<script>
var probeFailed = [];
addEventListener('error', function (e) {
  var t = e.target;
  if (t && t !== window && (t.src || t.href)) probeFailed.push(t.src || t.href);
}, true);
addEventListener('load', function () {
  function loaded(root) {
    return Array.from(root.querySelectorAll('img')).filter(function (i) { return i.naturalWidth > 0; }).length
      + root.querySelectorAll('.jp-RenderedSVG svg').length;
  }
  var widgets = Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'))
    .map(function (s) {
      var out = s.closest('.jp-OutputArea-output') || s.parentElement, cell = s.closest('.jp-Cell');
      var near = [], c = cell, k;
      for (k = 0, c = cell; k < 2 && c && (c = c.previousElementSibling); k++) near.push(c);
      for (k = 0, c = cell; k < 2 && c && (c = c.nextElementSibling); k++) near.push(c);
      return {model: JSON.parse(s.textContent).model_id, text: out.innerText.trim().slice(0, 200), height: out.getBoundingClientRect().height,
              figures_near: near.reduce(function (n, c) { return n + loaded(c); }, 0)};
    });
  // The text a reader sees outside code: TeX left there (\frac, or a $...$ holding TeX) is maths
  // that did not render.
  var walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT), node, prose = [];
  while ((node = walk.nextNode()))
    if (!node.parentElement.closest('pre, code, script, style, math') && node.parentElement.getClientRects().length)
      prose.push(node.data);
  var tex = prose.join(' ').match(/\\[A-Za-z]+|\$[^$\n]*[\\^_{][^$\n]*\$/g) || [];
  var r = {
    title: document.title,
    maths: Array.from(document.querySelectorAll('math')).filter(function (m) {
      var b = m.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length,
    tex: tex.slice(0, 5),
    nav: (document.querySelector('body > nav') || {innerText: ''}).innerText,
    imgs: Array.from(document.images).map(function (i) {
      return {src: (i.getAttribute('src') || '').slice(0, 40), ok: i.complete && i.naturalWidth > 0,
              width: i.getBoundingClientRect().width}; }),
    svgs: Array.from(document.querySelectorAll('.jp-RenderedSVG svg')).map(function (s) {
      return s.getBoundingClientRect().width; }),
    links: Array.from(document.querySelectorAll('a[href]')).map(function (a) { return a.getAttribute('href'); }),
    items: Array.from(document.querySelectorAll('li')).map(function (li) { return li.innerText; }),
    widgets: widgets, failed: probeFailed, text: document.body.innerText.length};
  var pre = document.createElement('pre');
  pre.id = 'site-probe';
  pre.style.display = 'none';
  pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def browser():
    exe = os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if not exe:
        pytest.skip("no Chromium to open the site with (looked for " + ", ".join(BROWSERS) + "); "
                    "install Debian's chromium package as .ci/run does: apt-get install chromium")
    return exe


@pytest.fixture(scope="module")
def built_site(browser, executed_dir, tmp_path_factory):
    """The site rendered from this session's executed notebooks (executing any that are missing)."""
    for src in LECTURES:
        if not (executed_dir / src.name).exists():  # this file runs without test_notebooks.py
            site.execute(src, executed_dir / src.name, smoke=True)
    out = tmp_path_factory.mktemp("site")
    site.write_site([executed_dir / p.name for p in LECTURES], out, site.machine_line(smoke=True))
    return out


def browse(browser, page):
    """Open page in headless Chromium, offline; the probe's report and the screenshot's path."""
    probe = page.with_name(f"probe-{page.name}")
    text, found = re.subn(r"<meta charset[^>]*>", lambda m: m.group(0) + PROBE, page.read_text(),
                          count=1, flags=re.I)
    assert found, f"{page.name} declares no <meta charset>"
    probe.write_text(text)
    shot = page.with_suffix(".png")
    profile = page.parent / f"profile-{page.stem}"
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", "--dump-dom",
           probe.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    shutil.rmtree(profile, ignore_errors=True)
    m = re.search(r'<pre id="site-probe"[^>]*>(.*?)</pre>', done.stdout, re.S)
    said = "\n".join(line for line in done.stderr.splitlines() if "dbus" not in line)  # dbus: noise
    assert done.returncode == 0 and m, f"Chromium could not open {page.name} (exit {done.returncode}):\n" \
        + said[-2000:]
    return json.loads(html.unescape(m.group(1))), shot


def formulas(nb):
    """How many formulas the notebook's markdown holds ($...$ or $$...$$ outside code), counted from
    the source, not with the converter the site uses, so a formula the converter misses shows."""
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    text = re.sub(r"```.*?```|`[^`\n]*`", "", text, flags=re.S)
    return len(re.findall(r"(?<!\\)\$\$.+?(?<!\\)\$\$|(?<![\\$])\$[^$]+?(?<![\\$])\$", text, re.S))


def draws_output(state, model_id):
    """Whether a widget shows outputs (an interact's figure lives in an Output widget)."""
    model = state.get(model_id, {})
    children = model.get("state", {}).get("children", [])
    return model.get("model_name") == "OutputModel" or any(
        draws_output(state, c.removeprefix("IPY_MODEL_")) for c in children if isinstance(c, str))


def assert_screenshot_shows_something(shot, name):
    from matplotlib import image

    assert shot.exists(), f"Chromium took no screenshot of {name}"
    pixels = image.imread(str(shot))[..., :3]
    inked = (pixels.min(axis=-1) < 0.9).mean()
    assert inked > 0.01, f"the screenshot of {name} ({shot}) is blank: {inked:.2%} of it is not white"


def test_index_lists_every_lecture_in_order(browser, built_site):
    report, shot = browse(browser, built_site / "index.html")
    assert_screenshot_shows_something(shot, "index.html")
    assert report["links"] == [f"{p.stem}.html" for p in LECTURES], "the index links every lecture, in order"
    assert all((built_site / link).exists() for link in report["links"])
    for item, src in zip(report["items"], LECTURES):
        title, summary = site.title_and_summary(src)
        assert title in item and summary and summary in item, f"the index gives {src.stem} a title and a line"
    assert "Executed" in (built_site / "index.html").read_text(), "the index states the machine"


@pytest.mark.parametrize("src", LECTURES, ids=lambda p: p.stem)
def test_page_loads_and_its_figures_render(browser, built_site, executed_dir, src):
    page = built_site / f"{src.stem}.html"
    report, shot = browse(browser, page)
    name = page.name
    assert_screenshot_shows_something(shot, name)
    assert report["text"] > 1000, f"{name} shows almost no text"
    assert report["title"] == site.title_and_summary(src)[0], f"{name}'s <title> is the lecture's title"

    i = LECTURES.index(src)
    nav = report["nav"]
    assert "index" in nav and "Executed" in nav and "cores" in nav, \
        f"{name} opens with the nav (prev | index | next) and the machine it ran on; it shows {nav!r}"
    expected = ["index.html"] + [f"{p.stem}.html" for p in LECTURES[max(i - 1, 0):i + 2] if p != src]
    local = [h for h in report["links"] if h.endswith(".html") and not re.match(r"[a-z]+:", h)]
    assert set(expected) <= set(local), f"{name} links to {expected}; it links to {local}"
    assert all((built_site / h).exists() for h in local), f"{name} links to a page that does not exist"

    local_failed = [u[:80] for u in report["failed"] if not u.startswith(("http:", "https:"))]
    assert not local_failed, f"{name}: the browser could not load {local_failed}"
    external = [img["src"] for img in report["imgs"] if not img["src"].startswith("data:")]
    assert not external, f"{name} has images that are not embedded in the page: {external}"
    broken = [img["src"] for img in report["imgs"] if not img["ok"]]
    assert not broken, f"{name}: {len(broken)} of {len(report['imgs'])} images did not load: {broken}"
    hidden = [img["src"] for img in report["imgs"] if img["width"] < 50]
    assert not hidden, f"{name}: images drawn less than 50 px wide: {hidden}"

    nb = json.loads((executed_dir / src.name).read_text())
    figures = sum(1 for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
                  if any(t in o.get("data", {}) for t in IMAGE_TYPES))
    shown = len(report["imgs"]) + len(report["svgs"])
    assert shown >= figures, f"{name} shows {shown} figures; the executed notebook has {figures}"

    expected = formulas(nb)
    assert report["maths"] >= expected, \
        f"{name} draws {report['maths']} formulas; its markdown has {expected} (is the maths MathML?)"
    assert not report["tex"], f"{name} shows raw TeX, maths that did not render: {report['tex']}"
    mathjax = [u for u in report["failed"] if "mathjax" in u.lower()]
    assert not mathjax, f"{name} still fetches MathJax, which fails offline: {mathjax}"

    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    state = state.get("state", {})
    for w in report["widgets"]:
        assert w["model"] in state, f"{name}: a widget's state was not saved in the notebook"
        if draws_output(state, w["model"]):  # an interact's figure: offline it cannot draw
            assert w["figures_near"] > 0, \
                f"{name}: a widget that draws has no static figure within two cells of it"
        assert "error" not in w["text"].lower(), f"{name}: a widget shows an error offline: {w['text']!r}"
        assert w["height"] < 200, f"{name}: a widget leaves a {w['height']:.0f} px blank offline"
