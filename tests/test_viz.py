"""Token-credit views (HTML, terminal) and their shared colouring/grouping."""

from __future__ import annotations

import dataclasses
import html.parser

import pytest

from oar.attribution import AttributionRecord, record_correlation
from oar.viz.html import render_html, write_html
from oar.viz.style import ANSWER, COOL, NEUTRAL, WARM, WHITE, group_records, token_rgb, weight_range
from oar.viz.terminal import record_text, render_terminal

TOKENS = ["Let", " x", " <", "&", "\n", "é", "", " 2", " \\boxed{", "2", "}"]


def make_record(credit: str = "oar-g", scores=None, step: int | None = 5, prompt: str = "What <is> x?"):
    n = len(TOKENS)
    reasoning = [i < 8 for i in range(n)]
    scores = list(scores) if scores is not None else [0.1 * (i + 1) if reasoning[i] else 0.0 for i in range(n)]
    weights = [0.2, 0.6, 1.0, 1.4, 0.9, 2.5, 1.1, 0.3, 1.0, 1.0, 1.0]
    return AttributionRecord(TOKENS, scores, weights, reasoning, [not r for r in reasoning], credit,
                             prompt=prompt, advantage=0.75, reward=1.0, step=step)


def test_group_records_puts_credits_of_one_completion_together():
    a, b = make_record("oar-g"), make_record("entropy")
    other = make_record("oar-g", prompt="another")
    later = make_record("oar-g", step=6)
    groups = group_records([a, other, b, later, make_record("oar-g")])
    assert [[r.credit for r in g] for g in groups] == [["oar-g", "entropy"], ["oar-g"], ["oar-g"], ["oar-g"]]
    assert groups[1][0].prompt == "another" and groups[2][0].step == 6


def test_token_colours():
    scale = (0.25, 2.0)
    assert token_rgb(1.0, True, False, scale) == WHITE
    cool, warm = token_rgb(0.5, True, False, scale), token_rgb(1.5, True, False, scale)
    assert cool[2] > cool[0] and warm[0] > warm[2]  # suppressed blue-ish, boosted red-ish
    assert token_rgb(0.25, True, False, scale) == COOL and token_rgb(2.0, True, False, scale) == WARM
    assert sum(COOL) < sum(cool) < sum(WHITE)  # intensity grows with |log w|: 0.5 is half-way to 0.25
    assert token_rgb(0.1, True, False, scale) == COOL and token_rgb(9.0, True, False, scale) == WARM  # saturates
    assert token_rgb(3.0, False, True, scale) == ANSWER and token_rgb(3.0, False, False, scale) == NEUTRAL
    assert weight_range([make_record()]) == (0.2, 2.5)


class _Spans(html.parser.HTMLParser):
    """Collects the token spans of a page: (attributes, text) per span, grouped per tokens block."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[list[tuple[dict, str]]] = []
        self.current: tuple[dict, list[str]] | None = None
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.urls += [v for k, v in attrs.items() if k in ("src", "href")]
        if tag == "div" and attrs.get("class") == "tokens":
            self.blocks.append([])
        if tag == "span" and "tok" in attrs.get("class", "").split():
            self.current = (attrs, [])

    def handle_endtag(self, tag):
        if tag == "span" and self.current is not None:
            self.blocks[-1].append((self.current[0], "".join(self.current[1])))
            self.current = None

    def handle_data(self, data):
        if self.current is not None:
            self.current[1].append(data)


def test_html_one_coloured_span_per_token_side_by_side():
    a = make_record("oar-g")
    b = make_record("entropy", scores=[0.8, 0.1, 0.3, 0.2, 0.9, 0.5, 0.4, 0.7, 0, 0, 0])
    page = render_html([a, b, make_record("oar-g", prompt="second")], title="t<1>")
    parser = _Spans()
    parser.feed(page)
    assert len(parser.blocks) == 3
    scale = weight_range([a, b])
    for block, rec in zip(parser.blocks, [a, b, a], strict=True):
        assert "".join(text for _, text in block) == rec.text  # whitespace, newlines, escapes faithful
        assert len(block) == len(rec.tokens)
        for i, (attrs, _) in enumerate(block):
            rgb = token_rgb(rec.weights[i], rec.reasoning[i], rec.answer[i], scale)
            assert attrs["style"] == "background:#{:02x}{:02x}{:02x}".format(*rgb)
            assert f"score {rec.scores[i]:.4g}" in attrs["title"] and f"weight {rec.weights[i]:.3f}" in attrs["title"]
            assert attrs["data-i"] == str(i)
            assert ("a" in attrs["class"].split()) == rec.answer[i]
    assert parser.urls == []  # self-contained: nothing to fetch
    assert "default-src 'none'" in page and "<title>t&lt;1&gt;</title>" in page
    assert "What &lt;is&gt; x?" in page and "<is>" not in page
    rho = record_correlation(a, b)
    assert page.count(f"{rho:+.3f}") == 2  # the example's table and the page mean (one example with both)
    assert page.count('class="example"') == 2


def test_html_rejects_empty_and_writes_atomically(tmp_path):
    with pytest.raises(ValueError, match="no attribution records"):
        render_html([])
    out = write_html(tmp_path / "sub" / "p.html", [make_record()])
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.html"]


def test_terminal_rendering():
    from rich.console import Console

    a, b = make_record("oar-g"), make_record("entropy", scores=[0.8, 0.1, 0.3, 0.2, 0.9, 0.5, 0.4, 0.7, 0, 0, 0])
    scale = weight_range([a])
    text = record_text(a, scale)
    assert text.plain == a.text
    assert len(text.spans) == len([t for t in a.tokens if t])  # rich drops empty spans
    first = text.spans[0]
    assert a.text[first.start : first.end] == "Let" and "rgb(" in str(first.style)
    console = Console(record=True, width=160, color_system="truecolor")
    render_terminal([a, b], console)
    out = console.export_text()
    assert "Let x <&" in out and "\\boxed{2}" in out
    assert f"rho(oar-g, entropy) of the applied credit over reasoning tokens = {record_correlation(a, b):+.3f}" in out
    assert "What <is> x?" in out
    with pytest.raises(ValueError, match="no attribution records"):
        render_terminal([], console)


def test_weight_range_ignores_non_reasoning_and_bad_weights():
    r = dataclasses.replace(make_record(), weights=[1.0] * 8 + [50.0, 0.0, float("nan")])
    assert weight_range([r]) == (1.0, 1.0)
    assert token_rgb(0.5, True, False, (1.0, 1.0)) == WHITE and token_rgb(float("nan"), True, False, (0.5, 2)) == WHITE
    only_boost = dataclasses.replace(make_record(), weights=[1.5] * 11)
    assert weight_range([only_boost]) == (1.0, 1.5)
