"""The Jinja2 environment that renders the report's templates, with escaping always on.

Every ``{{ value }}`` in a template is HTML-escaped (quotes and apostrophes included, as
the standard library's ``html.escape`` writes them); ``None`` prints as nothing. Only
values marked safe pass unescaped: the output of macros and of the filters below, the
CSS and JavaScript assets, and plotly.js itself. JSON for a ``<script>`` block goes
through ``script_json``, which keeps ``</script>``, ``<!--`` and U+2028/9 out of it.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
from typing import Any

import jinja2
from markupsafe import Markup

from vramscope.report.model import strict_json

TEMPLATE_PACKAGE = "vramscope.report.html"


def escape(value: Any) -> Markup:
    """Escape any value for HTML text and attribute values (``None`` is empty)."""
    if hasattr(value, "__html__"):
        return Markup(value.__html__())
    return Markup(html.escape("" if value is None else str(value), quote=True))


def script_json(data: Any) -> Markup:
    """JSON that is safe inside <script>: no ``</script>``, no ``<!--``, no raw ``<>&``."""
    text = strict_json(data, separators=(",", ":"), ensure_ascii=False)
    return Markup(
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


@functools.lru_cache(maxsize=2)
def plotlyjs_payload(compress: bool = True) -> tuple[str, str]:
    """plotly.js from the installed plotly package: (encoding, text to embed)."""
    from plotly.offline import get_plotlyjs

    source = get_plotlyjs()
    if not compress:
        # a raw script inside a JSON-free <script type="text/plain"> must not close it
        return "plain", source.replace("</script", "<\\/script")
    packed = base64.b64encode(gzip.compress(source.encode("utf-8"), compresslevel=9, mtime=0))
    return "gzip+base64", packed.decode("ascii")


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The templates under ``templates/``, autoescaped, strict about undefined names."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, "templates"),
        autoescape=jinja2.select_autoescape(["html"], default_for_string=True),
        finalize=escape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["script_json"] = script_json
    env.globals["asset"] = asset
    return env


@functools.cache
def asset(name: str) -> Markup:
    """A CSS or JavaScript file of ``templates/assets/``, as it is (never a template)."""
    loader = environment().loader
    assert loader is not None
    source, _, _ = loader.get_source(environment(), f"assets/{name}")
    return Markup(source)


def render_template(name: str, **context: Any) -> str:
    """Render one template of ``templates/`` with ``context``."""
    return environment().get_template(name).render(**context)
