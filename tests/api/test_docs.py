"""/docs (Swagger UI) and /redoc render without internet: every script, stylesheet, icon and the schema they load is
served by the app itself on the live loopback server, and neither page names an asset on another host."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

# What each kind of asset must come back as: a browser refuses a script or stylesheet of the wrong type.
CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "application/json"}


class _AssetLinks(HTMLParser):
    """The URLs a page makes the browser fetch: `<script src>`, `<link href>`, `<img src>` and ReDoc's spec-url."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        wanted = {"script": "src", "link": "href", "img": "src", "redoc": "spec-url"}.get(tag)
        self.urls += [v for k, v in attrs if k == wanted and v]


def _asset_urls(html: str) -> list[str]:
    parser = _AssetLinks()
    parser.feed(html)
    # Swagger UI gets its schema from the bundle's config in an inline script: `url: '/openapi.json'`.
    return parser.urls + re.findall(r"\burl:\s*'([^']+)'", html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_page_loads_every_asset_from_the_app(live, page: str) -> None:
    r = httpx.get(f"{live.url}{page}", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    urls = _asset_urls(r.text)
    # The page's own script (Swagger UI or ReDoc), its schema and its icon at least.
    assert any(u.endswith(".js") for u in urls) and "/openapi.json" in urls, urls
    for url in urls:
        absolute = urljoin(f"{live.url}{page}", url)
        assert urlsplit(absolute).netloc == urlsplit(live.url).netloc, f"{page} loads {url} from another host"
        asset = httpx.get(absolute, timeout=30)
        assert asset.status_code == 200 and asset.content, f"{url}: {asset.status_code}"
        suffix = re.search(r"\.[a-z]+$", urlsplit(absolute).path)
        assert suffix and CONTENT_TYPES[suffix.group()] in asset.headers["content-type"], (url, asset.headers)
    foreign = [u for u in re.findall(r"https?://[^\s\"'<>)]+", r.text) if not u.startswith(live.url)]
    assert not foreign, f"{page} names outside URLs {foreign}"


def test_swagger_ui_sends_the_schema_to_no_online_validator(live) -> None:
    """Swagger UI's default validator badge posts the schema to an outside service: switched off."""
    html = httpx.get(f"{live.url}/docs", timeout=30).text
    assert '"validatorUrl": null' in html


def test_the_docs_pages_let_the_browser_fetch_only_from_this_server(live) -> None:
    """ReDoc's bundle draws a logo from Redocly's CDN whatever the page says: the pages' policy keeps every fetch
    (images included) on this server, so the browser never asks the CDN."""

    bundle = httpx.get(f"{live.url}/static-offline-docs/redoc.standalone.js", timeout=30).text
    assert "https://cdn.redoc.ly/" in bundle  # what the policy is for
    for page in ("/docs", "/redoc"):
        policy = httpx.get(f"{live.url}{page}", timeout=30).headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["default-src"] == "'self'" and directives["img-src"] == "'self' data:"
        assert all("http" not in sources and "*" not in sources for sources in directives.values()), policy
    assert "content-security-policy" not in httpx.get(f"{live.url}/healthz", timeout=30).headers  # the pages only


def test_the_schema_carries_the_package_version(live) -> None:
    import upscale

    assert httpx.get(f"{live.url}/openapi.json", timeout=30).json()["info"]["version"] == upscale.__version__
