"""A self-contained HTML page of token credit: one coloured span per token, credits side by side.

No network fetch: styles and the small hover script are inline, and a Content-Security-Policy forbids
every other source.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from html import escape
from pathlib import Path

from oar.attribution import AttributionRecord
from oar.files import atomic_write
from oar.viz.style import (
    ANSWER,
    COOL,
    NEUTRAL,
    WARM,
    correlations,
    describe,
    group_records,
    token_rgb,
    tooltip,
    weight_range,
)

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;max-width:110rem}
h1{font-size:1.3rem}h2{font-size:1.05rem;margin:0 0 .3rem}h3{font-size:.95rem;margin:0}
.meta{color:#555;font-size:.85rem;margin:.2rem 0}
.legend{display:flex;gap:1rem;align-items:center;font-size:.85rem;flex-wrap:wrap}
.bar{width:16rem;height:.9rem;border:1px solid #ccc}
.key{display:inline-block;width:1.6rem;height:.9rem;border:1px solid #ccc;vertical-align:middle}
.example{border-top:1px solid #ddd;padding:.8rem 0}
.cols{display:grid;gap:1rem}
.tokens{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace;
font-size:.85rem;line-height:1.7}
.prompt{white-space:pre-wrap;font-size:.85rem;background:#f6f6f6;padding:.4rem}
.tok{border-radius:2px}
.tok.a{outline:1px dashed #6a4bc4;outline-offset:-1px}
.tok.nl::before{content:"\\21B5";color:#999}
.tok.e{padding:0 1px}
.tok.hl{outline:2px solid #111;outline-offset:-1px}
table.rho{border-collapse:collapse;font-size:.85rem;margin:.3rem 0}
table.rho td,table.rho th{border:1px solid #ddd;padding:.1rem .5rem}
"""

# hovering a token outlines the token at the same position under every credit of its example
_JS = """
for (const ex of document.querySelectorAll(".example")) {
  const clear = () => { for (const s of ex.querySelectorAll(".tok.hl")) s.classList.remove("hl"); };
  ex.addEventListener("mouseover", (e) => {
    const t = e.target.closest(".tok");
    if (!t) return;
    clear();
    for (const s of ex.querySelectorAll('.tok[data-i="' + t.dataset.i + '"]')) s.classList.add("hl");
  });
  ex.addEventListener("mouseleave", clear);
}
"""


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _tokens_html(record: AttributionRecord, scale: tuple[float, float]) -> str:
    spans = []
    for i, tok in enumerate(record.tokens):
        role = "a" if record.answer[i] else "r" if record.reasoning[i] else "o"
        classes = "tok " + role + (" nl" if "\n" in tok else "") + ("" if tok else " e")
        colour = _hex(token_rgb(record.weights[i], record.reasoning[i], record.answer[i], scale))
        spans.append(f'<span class="{classes}" data-i="{i}" style="background:{colour}" '
                     f'title="{escape(tooltip(record, i))}">{escape(tok)}</span>')
    return "".join(spans)


def _legend(scale: tuple[float, float]) -> str:
    lo, hi = scale
    bar = f"background:linear-gradient(to right,{_hex(COOL)},#ffffff,{_hex(WARM)})"
    return (
        '<div class="legend">'
        f'<span>weight {lo:.2f} (suppressed)</span><span class="bar" style="{bar}"></span>'
        f"<span>{hi:.2f} (boosted)</span>"
        f'<span><span class="key" style="background:{_hex(ANSWER)};outline:1px dashed #6a4bc4"></span> answer</span>'
        f'<span><span class="key" style="background:{_hex(NEUTRAL)}"></span> not reasoning</span>'
        "<span>hover a token for its raw score and weight</span></div>"
    )


def _rho_table(pairs: list[tuple[str, str, float]], caption: str) -> str:
    rows = "".join(f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td>{rho:+.3f}</td></tr>"
                   for a, b, rho in pairs)
    return (f'<p class="meta">{escape(caption)}</p><table class="rho">'
            f"<tr><th>credit</th><th>credit</th><th>Spearman ρ</th></tr>{rows}</table>")


def _mean_correlations(groups: list[list[AttributionRecord]]) -> list[tuple[str, str, float]]:
    sums: dict[tuple[str, str], list[float]] = {}
    for g in groups:
        for a, b, rho in correlations(g):
            if not math.isnan(rho):
                sums.setdefault((a, b), []).append(rho)
    return [(a, b, sum(v) / len(v)) for (a, b), v in sums.items()]


def render_html(records: Sequence[AttributionRecord], title: str = "OAR token credit") -> str:
    """The page as a string: records of the same completion (see :func:`oar.viz.style.group_records`) are
    drawn side by side with their pairwise Spearman correlation; one colour range for the whole page."""
    if not records:
        raise ValueError("no attribution records to render")
    groups = group_records(records)
    scale = weight_range(records)
    credits = list(dict.fromkeys(r.credit for r in records))
    count = f"{len(groups)} completion" + "s" * (len(groups) != 1)
    body = [f"<h1>{escape(title)}</h1>",
            f'<p class="meta">{count} · credit: {escape(", ".join(credits))}</p>',
            _legend(scale)]
    overall = _mean_correlations(groups) if len(groups) > 1 else []
    if overall:
        body.append(_rho_table(overall, "mean rank correlation of the applied credit (weights; token advantages "
                                        "where a method adds to the advantage) over reasoning tokens, all examples"))
    for n, group in enumerate(groups, 1):
        first = group[0]
        meta = " · ".join(f"{k} {getattr(first, k):g}" for k in ("step", "reward", "advantage")
                          if isinstance(getattr(first, k), (int, float)))
        body.append(f'<section class="example" id="ex{n}"><h2>Example {n}</h2>')
        if meta:
            body.append(f'<p class="meta">{escape(meta)}</p>')
        if first.prompt:
            body.append(f'<details><summary>prompt</summary><pre class="prompt">{escape(first.prompt)}</pre></details>')
        if len(group) > 1:
            body.append(_rho_table(correlations(group), "rank correlation of the applied credit over reasoning tokens"))
        body.append(f'<div class="cols" style="grid-template-columns:repeat({len(group)},minmax(0,1fr))">')
        for r in group:
            body.append(f'<div class="col" data-credit="{escape(r.credit)}"><h3>{escape(r.credit)}</h3>'
                        f'<p class="meta">{escape(describe(r))}</p>'
                        f'<div class="tokens">{_tokens_html(r, scale)}</div></div>')
        body.append("</div></section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + f"\n<script>{_JS}</script>\n</body></html>\n"
    )


def write_html(path: str | os.PathLike, records: Sequence[AttributionRecord], title: str = "OAR token credit") -> Path:
    """Render ``records`` (see :func:`render_html`) to ``path`` atomically; returns the path."""
    return atomic_write(path, render_html(records, title))
