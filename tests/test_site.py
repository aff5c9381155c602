"""The instructor's site, opened in headless Chromium with the network off: the index and every lecture
page load, the sidebar lists every lecture in order, the page has its table of contents, prev/next
and the machine banner, figures and formulas render, no code cell scrolls sideways at a laptop's
1280 px, the download links resolve, and the offline search finds a term in the one lecture that
holds it.

The site is built (helpers.site.build.write_site, Sphinx) from the notebooks tests/test_notebooks.py
executed in this session, so `make test` executes each lecture once; run alone, this test executes
them itself (SMOKE, a few minutes). Without a Chromium it skips and says why (.ci/run installs
Debian's chromium).

Each page is opened once with every host name unresolvable. A small script injected into a copy of
the page reports, at the load event, what the browser made of it; --dump-dom brings that report back
and --screenshot a picture. The search page runs Sphinx's own script, given virtual time to finish.
"""
import html
import json
import os
import re
import shutil
import subprocess

import sys
import tempfile
from pathlib import Path

import pytest

from helpers.site import images, build as site

LECTURES = site.lectures()
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--window-size=1280,1600"]
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")
SEARCH_TERMS = ("Ulysses", "PowerSGD", "zig-zag", "DataParallel")  # the first held by one lecture only is searched

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
      + root.querySelectorAll('svg.figure, .cell_output svg').length;
  }
  var widgets = Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'))
    .map(function (s) {
      var out = s.closest('.cell_output') || s.parentElement, cell = s.closest('.cell');
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
  // a folded cell (MyST-NB's hide-input) is opened, as a reader who wants its code opens it
  document.querySelectorAll('.cell details').forEach(function (d) { d.open = true; });
  var r = {
    title: document.title,
    maths: Array.from(document.querySelectorAll('math')).filter(function (m) {
      var b = m.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length,
    tex: tex.slice(0, 5),
    banner: (document.querySelector('.bd-header-announcement') || {innerText: ''}).innerText,
    sidebar: Array.from(document.querySelectorAll('nav.bd-docs-nav a')).map(function (a) {
      return [a.getAttribute('href'), a.innerText.trim()]; }),
    prev: (document.querySelector('a.left-prev') || {getAttribute: function () { return null; }}).getAttribute('href'),
    next: (document.querySelector('a.right-next') || {getAttribute: function () { return null; }}).getAttribute('href'),
    toc: document.querySelectorAll('#pst-page-toc-nav a').length,
    downloads: Array.from(document.querySelectorAll('a.download')).map(function (a) { return a.getAttribute('href'); }),
    scripts: Array.from(document.scripts).map(function (s) { return s.getAttribute('src'); }).filter(Boolean),
    imgs: Array.from(document.images).map(function (i) {
      return {src: (i.getAttribute('src') || '').slice(0, 40), ok: i.complete && i.naturalWidth > 0,
              width: i.getBoundingClientRect().width}; }),
    svgs: Array.from(document.querySelectorAll('.cell_output svg')).map(function (s) {
      return s.getBoundingClientRect().width; }),
    links: Array.from(document.querySelectorAll('a[href]')).map(function (a) { return a.getAttribute('href'); }),
    items: Array.from(document.querySelectorAll('li')).map(function (li) { return li.innerText; }),
    widgets: widgets, failed: probeFailed, text: document.body.innerText.length,
    // code a reader would scroll sideways to read: a cell's input wider than its box
    wide_code: Array.from(document.querySelectorAll('.cell_input pre')).filter(function (p) {
      return p.scrollWidth > p.clientWidth + 1; }).map(function (p) {
      return p.innerText.split('\n').reduce(function (a, l) { return l.length > a.length ? l : a; }, ''); })};
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
    out = tmp_path_factory.mktemp("site") / "html"
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


def pages():
    return [f"{p.stem}.html" for p in LECTURES]


def assert_sidebar_lists_every_lecture(report, name):
    here = lambda href: href.split("#")[0] or name  # the page's own entry links to "#"
    listed = [(here(href), text) for href, text in report["sidebar"] if here(href) in pages()]
    titles = [site.title_and_summary(p)[0] for p in LECTURES]
    assert [h for h, _ in listed] == pages(), f"{name}'s sidebar lists {[h for h, _ in listed]}, not the {len(LECTURES)} lectures in order"
    assert [t for _, t in listed] == titles, f"{name}'s sidebar names the lectures {[t for _, t in listed]}"


def assert_offline_and_local(report, built_site, name):
    local_failed = [u[:80] for u in report["failed"] if not u.startswith(("http:", "https:"))]
    assert not local_failed, f"{name}: the browser could not load {local_failed}"
    remote = [u for u in report["scripts"] if re.match(r"(https?:)?//", u)]
    assert not remote, f"{name} loads scripts from the network, which fail offline: {remote}"
    broken = [img["src"] for img in report["imgs"] if not img["ok"]]
    assert not broken, f"{name}: {len(broken)} of {len(report['imgs'])} images did not load: {broken}"
    local = {h.split("#")[0].split("?")[0] for h in report["links"] if not re.match(r"[a-z]+:|#", h)}
    missing = sorted(h for h in local if h and not (built_site / h).exists())
    assert not missing, f"{name} links to files the site does not have: {missing}"
    assert "Executed" in report["banner"] and "cores" in report["banner"], \
        f"{name}'s banner states the machine the numbers come from; it shows {report['banner']!r}"


def machine_paths(text):
    """The traces of the build machine a rendered page must not show: this checkout's path, the
    environment's, site-packages, temporary folders (Python's, spawn's, pytest's), a traceback."""
    marks = [str(Path(__file__).resolve().parents[1]), sys.prefix, "site-packages",
             "Traceback (most recent call last)", "pytest-of-", "/spawn-",
             str(Path(tempfile.gettempdir()) / "tmp")]
    return [m for m in marks if m in text]


def test_machine_paths_are_found_in_a_page():
    assert machine_paths("<p>all-reduce, 4 ranks, 12.3 ms</p>") == []
    page = f"<pre>File {sys.prefix}/lib/python3/site-packages/torch/x.py</pre>"
    assert sys.prefix in machine_paths(page) and "site-packages" in machine_paths(page)
    assert machine_paths(f"wrote {tempfile.gettempdir()}/tmpab12cd/trace.json")


def test_index_lists_every_lecture_in_order(browser, built_site):
    report, shot = browse(browser, built_site / "index.html")
    assert_screenshot_shows_something(shot, "index.html")
    assert_sidebar_lists_every_lecture(report, "index.html")
    assert_offline_and_local(report, built_site, "index.html")
    body = [h for h in report["links"] if h in pages()]
    assert list(dict.fromkeys(body)) == pages(), "the index links every lecture, in order"
    text = (built_site / "index.html").read_text()
    for src in LECTURES:
        title, summary = site.title_and_summary(src)
        assert html.escape(title, quote=False) in text and summary, f"the index gives {src.stem} a title and a line"
    figures = images.kept()
    shown = [img["src"] for img in report["imgs"] if img["ok"] and img["width"] >= 200]
    assert len(shown) >= len(figures), f"the index shows {len(shown)} key figures; images/ keeps {len(figures)}"
    assert report["next"] == pages()[0], "the index's next page is lecture 00"


@pytest.mark.parametrize("src", LECTURES, ids=lambda p: p.stem)
def test_page_loads_and_its_figures_render(browser, built_site, executed_dir, src):
    page = built_site / f"{src.stem}.html"
    report, shot = browse(browser, page)
    name = page.name
    assert_screenshot_shows_something(shot, name)
    shown = machine_paths(html.unescape(page.read_text(errors="replace")))
    assert not shown, f"{name} shows paths of the machine that built it: {shown}"
    assert report["text"] > 1000, f"{name} shows almost no text"
    title = site.title_and_summary(src)[0]
    assert report["title"].startswith(title), f"{name}'s <title> begins with the lecture's title"
    assert_sidebar_lists_every_lecture(report, name)
    assert_offline_and_local(report, built_site, name)

    i = LECTURES.index(src)
    assert report["prev"] == (pages()[i - 1] if i else "index.html"), f"{name}'s previous page is {report['prev']}"
    assert report["next"] == (pages()[i + 1] if i + 1 < len(LECTURES) else None), f"{name}'s next page is {report['next']}"
    sections = sum(1 for c in json.loads(src.read_text())["cells"] if c["cell_type"] == "markdown"
                   for line in "".join(c["source"]).splitlines() if re.match(r"##+ ", line))
    assert report["toc"] >= min(sections, 2), f"{name}'s table of contents has {report['toc']} entries"

    downloads = [built_site / h for h in report["downloads"]]
    assert sorted(p.name for p in downloads) == sorted([src.name] + [f"{src.name[:2]}_solutions.py"]), \
        f"{name} links its notebook and its solutions for download; it links {report['downloads']}"
    notebook = next(p for p in downloads if p.suffix == ".ipynb")
    assert notebook.read_bytes() == src.read_bytes(), f"{name}'s notebook to download is the lecture as committed, without outputs"

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
    assert not report["wide_code"], \
        f"{name}: code scrolls sideways at 1280 px, e.g. {report['wide_code'][0]!r} (site.css)"

    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    state = state.get("state", {})
    for w in report["widgets"]:
        assert w["model"] in state, f"{name}: a widget's state was not saved in the notebook"
        if draws_output(state, w["model"]):  # an interact's figure: with no kernel it cannot draw
            assert w["figures_near"] > 0, \
                f"{name}: a widget that draws has no static figure within two cells of it"
        assert "error" not in w["text"].lower(), f"{name}: a widget shows an error offline: {w['text']!r}"
        assert w["height"] < 200, f"{name}: a widget leaves a {w['height']:.0f} px blank offline"


def test_offline_search_finds_a_term_in_the_one_lecture_that_holds_it(browser, built_site):
    holding = {term: [p for p in LECTURES if term.lower() in p.read_text().lower()] for term in SEARCH_TERMS}
    term, where = next((t, w) for t, w in holding.items() if len(w) == 1)  # the test's own premise, checked
    profile = built_site / "profile-search"
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom",
           (built_site / "search.html").as_uri() + f"?q={term}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    shutil.rmtree(profile, ignore_errors=True)
    found = re.findall(r'<ul[^>]*class="search"[^>]*>(.*?)</ul>', done.stdout, re.S)
    hits = re.findall(r'<a href="([^"?#]+)', found[0]) if found else []
    assert hits == [f"{where[0].stem}.html"], \
        f"searching the site offline for {term!r} finds {hits}; only {where[0].name} holds it"
