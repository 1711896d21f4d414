"""The docs site: ``mkdocs build --strict`` passes, and the built site works in a real browser.

The browser is Debian's ``chromium``, run headless from the command line: ``--dump-dom`` for the
page as rendered (after its scripts ran), its console messages on stderr
(``--enable-logging=stderr``), and ``--screenshot``. No driver to pair with the browser's
version (Playwright pins its own Chromium build) and no download: the machine's browser is
enough. Without chromium the browser tests skip, except under ``CI=true``, where they fail.
Screenshots go to ``$ATW_ARTIFACTS_DIR`` (default ``.cache/artifacts/``).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.docs.blocks import REPO

ARTIFACTS = Path(os.environ.get("ATW_ARTIFACTS_DIR") or REPO / ".cache" / "artifacts")
#: Per page checked in the browser: its path, its screenshot, and what its rendered DOM must hold.
PAGES = {
    "home": ("", "docs-site-home.png", ('<h1 id="async-task-api-worker">', "The way in")),
    "api": (
        "api/worker/",
        "docs-site-api-worker.png",
        ('id="async_task_api_worker.Worker"', 'id="async_task_api_worker.Worker.task"'),
    ),
}
#: The nav's pages (each page links them all, at least: the check is not an empty one).
PAGES_OF_THE_NAV = re.findall(r"\.md$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (?P<message>.*)$", re.M)


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str], float]:
    """The site built strict into a folder of the test's own, its output and its time in s."""
    site = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        # Material's banner about its end of life is not a warning of the site's.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    return site, done, time.monotonic() - started


def test_the_site_builds_strict_with_no_warning(
    built: tuple[Path, subprocess.CompletedProcess[str], float],
) -> None:
    site, done, _ = built
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (site / "index.html").is_file()
    assert (site / "api" / "worker" / "index.html").is_file()
    # Every page of the nav was built, the placeholders of other pages' authors included.
    for page in ("getting-started", "commands", "tls", "integrations", "api/testing", "api/sfn"):
        assert (site / page / "index.html").is_file(), page


#: The modules of the API reference, by page; each name of their ``__all__`` has its entry there.
API_PAGES = {
    "async_task_api_worker": "api/worker",
    "async_task_api_worker.testing": "api/testing",
    "async_task_api_worker.sfn": "api/sfn",
    "async_task_api_worker.detached": "api/detached",
}
#: Entries under another id: the function ``sweep`` shares its name with its module.
API_IDS = {"async_task_api_worker.detached.sweep": "async_task_api_worker.detached.sweep.sweep"}


def test_the_api_reference_has_every_public_name(
    built: tuple[Path, subprocess.CompletedProcess[str], float],
) -> None:
    site, done, _ = built
    assert done.returncode == 0, done.stderr
    missing = []
    for module, page in API_PAGES.items():
        html = (site / page / "index.html").read_text()
        for name in importlib.import_module(module).__all__:
            if name == "__version__":
                assert "__version__" in html  # a sentence of the page, not an entry
                continue
            entry = API_IDS.get(f"{module}.{name}", f"{module}.{name}")
            if f'id="{entry}"' not in html:
                missing.append(entry)
    client = (site / "api" / "client" / "index.html").read_text()
    for method in ("submit", "cancel", "reports", "from_settings"):
        if f'id="async_task_api_worker.client.TaskClient.{method}"' not in client:
            missing.append(f"TaskClient.{method}")
    assert not missing


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        message = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def served(built: tuple[Path, subprocess.CompletedProcess[str], float]) -> Iterator[str]:
    """The built site over HTTP on a free port of 127.0.0.1: its base URL."""
    site, done, _ = built
    assert done.returncode == 0, done.stderr

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def browse(chromium: str, profile: Path, url: str, action: str) -> subprocess.CompletedProcess[str]:
    """Chromium headless on ``url``: ``--dump-dom`` or ``--screenshot=PATH``."""
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--window-size=1280,900", action, url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


class Links(HTMLParser):
    """The ids of a page and the URLs it refers to (links, stylesheets, scripts, images)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.urls: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("id", "name") if tag == "a" else ("id",):
            if values.get(name):
                self.ids.add(str(values[name]))
        wanted = {"a": "href", "link": "href", "script": "src", "img": "src"}.get(tag)
        if wanted and values.get(wanted):
            self.urls.add(str(values[wanted]))


def parsed(html: str) -> Links:
    links = Links()
    links.feed(html)
    return links


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - our own server
            return answer.status, answer.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, ""


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_page_renders_in_chromium_and_its_links_resolve(
    page: str, chromium: str, served: str, tmp_path: Path
) -> None:
    path, screenshot, expected = PAGES[page]
    url = served + path
    dumped = browse(chromium, tmp_path / "profile", url, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr
    dom = dumped.stdout
    for text in expected:
        assert text in dom, f"{text!r} not in the rendered {url}"
    console = [m["message"] for m in _CONSOLE.finditer(dumped.stderr) if served in m["message"]]
    assert not console, f"console messages on {url}: {console}"

    links = parsed(dom)
    broken = []
    checked = 0
    pages: dict[str, Links] = {}
    for reference in sorted(links.urls):
        target = urllib.parse.urljoin(url, reference)
        if not target.startswith(served):
            assert target.startswith(("https://", "http://", "mailto:")), reference
            continue  # another site: never fetched (the tests run offline)
        checked += 1
        without, _, fragment = target.partition("#")
        if without not in pages:
            status, body = fetch(without)
            if status != 200:
                broken.append(f"{reference}: HTTP {status}")
                continue
            pages[without] = parsed(body) if without != url else links
        if fragment and urllib.parse.unquote(fragment) not in pages[without].ids:
            broken.append(f"{reference}: no #{fragment} there")
    assert not broken, f"{url}: {broken}"
    assert checked > len(PAGES_OF_THE_NAV), f"{url}: only {checked} links of the site's own"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / screenshot).unlink(missing_ok=True)
    shot = browse(chromium, tmp_path / "profile", url, f"--screenshot={ARTIFACTS / screenshot}")
    assert shot.returncode == 0, shot.stderr
    assert (ARTIFACTS / screenshot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_prompts_and_output_are_left_out_of_a_copy(
    built: tuple[Path, subprocess.CompletedProcess[str], float],
) -> None:
    """A console block's ``$ `` prompts and output lines carry Pygments' ``gp`` and ``go``
    classes, which docs/stylesheets/extra.css leaves out of a selection and of the copy
    button's text; so every console block starts with a prompt (commands alone are
    ``shell``, output alone ``text``), or its copy would be empty."""
    site, done, _ = built
    assert done.returncode == 0, done.stderr
    css = (REPO / "docs" / "stylesheets" / "extra.css").read_text()
    assert ".highlight .gp," in css and "[data-md-copying] .go" in css
    page = (site / "getting-started" / "index.html").read_text()
    assert "stylesheets/extra.css" in page
    assert '<span class="gp">$ </span>uv<span class="w"> </span>run' in page
    assert '<span class="go">{"attempt":1,' in page
    unprompted = []
    for markdown in sorted((REPO / "docs").rglob("*.md")):
        for block in re.findall(r"^```console\n(.*?)^```$", markdown.read_text(), re.M | re.S):
            if not block.startswith("$ "):
                unprompted.append(f"{markdown.name}: {block.splitlines()[0]}")
    assert not unprompted
