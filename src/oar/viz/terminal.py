"""Token credit in the terminal with ``rich``: each token on its weight's colour, credits side by side."""

from __future__ import annotations

from collections.abc import Sequence

from oar.attribution import AttributionRecord
from oar.viz.style import ANSWER, COOL, WARM, correlations, describe, group_records, token_rgb, weight_range


def _rgb(rgb: tuple[int, int, int]) -> str:
    return "rgb({},{},{})".format(*rgb)


def record_text(record: AttributionRecord, scale: tuple[float, float]):
    """A ``rich.text.Text`` of the completion: black text on each token's colour, answer underlined."""
    from rich.text import Text

    text = Text()
    for i, tok in enumerate(record.tokens):
        style = f"black on {_rgb(token_rgb(record.weights[i], record.reasoning[i], record.answer[i], scale))}"
        text.append(tok, style=style + (" underline" if record.answer[i] else ""))
    return text


def legend(scale: tuple[float, float]):
    """One line explaining the colours."""
    from rich.text import Text

    lo, hi = scale
    text = Text("colour: ")
    text.append(f" weight {lo:.2f} ", style=f"black on {_rgb(COOL)}")
    text.append(" 1 ", style="black on rgb(255,255,255)")
    text.append(f" {hi:.2f} ", style=f"black on {_rgb(WARM)}")
    text.append("  ")
    text.append(" answer ", style=f"black on {_rgb(ANSWER)} underline")
    return text


def render_terminal(records: Sequence[AttributionRecord], console=None) -> None:
    """Print records to a ``rich`` console (default: stdout); one colour range for all of them."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if not records:
        raise ValueError("no attribution records to render")
    console = console or Console()
    scale = weight_range(records)
    console.print(legend(scale))
    for n, group in enumerate(group_records(records), 1):
        console.rule(f"example {n}")
        if group[0].prompt:
            console.print(Text.assemble(("prompt ", "bold"), group[0].prompt))
        table = Table(show_header=True, expand=True, show_lines=False)
        for r in group:
            table.add_column(describe(r), ratio=1, overflow="fold")
        table.add_row(*(record_text(r, scale) for r in group))
        console.print(table)
        for a, b, rho in correlations(group):
            console.print(f"Spearman rho({a}, {b}) of the applied credit over reasoning tokens = {rho:+.3f}",
                          highlight=False)
