"""``perfcast mva``: capacity planning with exact multi-server MVA, Schweitzer's approximation and MVASD."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from analyzer.mva import MVAResult
    from analyzer.mvasd import HoldoutResult, LoadTest


def _levels(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated user counts such as 504,1001, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"expected positive user counts, got {text!r}")
    return values


def _sampled(users: int, rows: int) -> list[int]:
    """Populations shown in the table: all when few, else about ``rows`` evenly spaced, always with the last."""
    if users <= rows:
        return list(range(1, users + 1))
    step = max(1, round(users / rows))
    picks = sorted({1, *range(step, users, step), users})
    return picks


@click.command("mva")
@click.argument("model_path", metavar="[MODEL.toml]", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--from", "loadtest_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Fit MVASD to a load-test result (perfcast-loadtest/1 JSON) instead of a model file.")
@click.option("--users", "-n", type=click.IntRange(min=1), help="Largest population N (default: 100, or the largest level).")
@click.option("--method", type=click.Choice(["exact", "schweitzer", "mvasd"]),
              help="Solver (default: mvasd when demands were measured at several levels, else exact).")
@click.option("--demands-vs", type=click.Choice(["users", "throughput"]), default="users", show_default=True,
              help="With --from: interpolate demands against users or against throughput.")
@click.option("--holdout", help="With --from: levels to predict from the others, e.g. 504,1001 (eq. 13 deviations).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON instead of a table.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write throughput, response time and demand curves to this PNG.")
@click.option("--rows", type=click.IntRange(min=2), default=20, show_default=True, help="Rows of the table when N is large.")
def mva(
    model_path: Path | None,
    loadtest_path: Path | None,
    users: int | None,
    method: str | None,
    demands_vs: str,
    holdout: str | None,
    as_json: bool,
    plot: Path | None,
    rows: int,
) -> None:
    """Throughput, response time and utilisation for n = 1..N users, and the bottleneck.

    \b
    perfcast mva model.toml --users 1500
    perfcast mva --from loadtest.json --users 1500 --holdout 504,1001 --plot curves.png
    """
    from analyzer.mva import solve_exact, solve_schweitzer
    from analyzer.mvasd import (
        holdout_deviation,
        model_from_loadtest,
        read_loadtest,
        solve_mvasd,
    )
    from analyzer.queueing import DemandAxis, load_model

    if (model_path is None) == (loadtest_path is None):
        raise click.UsageError("give either MODEL.toml or --from loadtest.json")
    held = _levels(holdout)
    if held and loadtest_path is None:
        raise click.UsageError("--holdout needs --from loadtest.json (measured levels to compare with)")
    axis = DemandAxis.USERS if demands_vs == "users" else DemandAxis.THROUGHPUT
    loadtest: LoadTest | None = None
    held_result: HoldoutResult | None = None
    if loadtest_path is not None:
        loadtest = read_loadtest(loadtest_path)
        if method not in (None, "mvasd"):
            raise click.UsageError("--from fits measured demands: only --method mvasd applies")
        method = "mvasd"
        n = users or max(*loadtest.users, *held)
        if held:
            held_result = holdout_deviation(loadtest, held, axis=axis)
            fitted = held_result.fitted_users
        else:
            fitted = loadtest.users
        model = model_from_loadtest(loadtest, fitted, axis=axis)
    else:
        assert model_path is not None
        model = load_model(model_path)
        n = users or 100
        method = method or ("mvasd" if model.has_measured_demands() else "exact")
    solver = {"exact": solve_exact, "schweitzer": solve_schweitzer, "mvasd": solve_mvasd}[method]
    result = solver(model, n)

    if plot is not None:
        _plot(result, loadtest, held, plot)
    if as_json:
        out = result.to_json()
        if held_result is not None:
            out["holdout"] = _holdout_json(held_result)
        click.echo(json.dumps(out))
        return
    _render(result, held_result, rows, plot)


def _holdout_json(h: HoldoutResult) -> dict[str, object]:
    return {
        "users": list(h.users),
        "fitted_users": list(h.fitted_users),
        "predicted_throughput_per_s": h.predicted_throughput_per_s.tolist(),
        "measured_throughput_per_s": h.measured_throughput_per_s.tolist(),
        "predicted_response_time_s": h.predicted_response_time_s.tolist(),
        "measured_response_time_s": h.measured_response_time_s.tolist(),
        "throughput_deviation_pct": h.throughput_deviation_pct,
        "cycle_time_deviation_pct": h.cycle_time_deviation_pct,
        "response_time_deviation_pct": h.response_time_deviation_pct,
    }


def _render(result: MVAResult, held: HoldoutResult | None, rows: int, plot: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{result.method} MVA, think time {result.think_time_s:g} s", title_justify="left")
    table.add_column("users", justify="right")
    table.add_column("X (req/s)", justify="right")
    table.add_column("R (ms)", justify="right")
    for name in result.utilization:
        table.add_column(f"U {name}", justify="right", style="bold" if name == result.bottleneck else None)
    for n in _sampled(len(result.users), rows):
        i = n - 1
        cells = [str(n), f"{result.throughput_per_s[i]:.4g}", f"{result.response_time_s[i] * 1e3:.4g}"]
        cells += [f"{u[i] * 100:.1f}%" for u in result.utilization.values()]
        table.add_row(*cells)
    console.print(table)
    last = len(result.users) - 1
    u = result.utilization.get(result.bottleneck)
    busy = f" ({u[last] * 100:.1f}% busy at n = {last + 1})" if u is not None else ""
    console.print(f"bottleneck: [bold]{result.bottleneck}[/bold]{busy}")
    if held is not None:
        h = Table(title=f"held-out levels, predicted from {', '.join(map(str, held.fitted_users))}", title_justify="left")
        for col in ("users", "X meas", "X pred", "X dev", "R meas ms", "R pred ms", "R dev"):
            h.add_column(col, justify="right")
        for i, users in enumerate(held.users):
            mx, px = held.measured_throughput_per_s[i], held.predicted_throughput_per_s[i]
            mr, pr = held.measured_response_time_s[i], held.predicted_response_time_s[i]
            h.add_row(
                str(users), f"{mx:.4g}", f"{px:.4g}", f"{abs(px - mx) / mx * 100:.2f}%",
                f"{mr * 1e3:.4g}", f"{pr * 1e3:.4g}", f"{abs(pr - mr) / mr * 100:.2f}%" if mr > 0 else "-",
            )
        console.print(h)
        console.print(
            f"mean deviation (eq. 13): throughput {held.throughput_deviation_pct:.2f}%, "
            f"cycle time R + Z {held.cycle_time_deviation_pct:.2f}%, "
            f"response time R {held.response_time_deviation_pct:.2f}%"
        )
    if plot is not None:
        console.print(f"plot written to {plot}")


def _plot(result: MVAResult, loadtest: LoadTest | None, held: tuple[int, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_x, ax_r, ax_d) = plt.subplots(1, 3, figsize=(15, 4.5))
    ax_x.plot(result.users, result.throughput_per_s, label=f"{result.method} prediction")
    ax_r.plot(result.users, result.response_time_s * 1e3, label=f"{result.method} prediction")
    for name, demand in result.demand_s.items():
        ax_d.plot(result.users, demand * 1e3, label=name)
    if loadtest is not None:
        for marker, label, levels in (
            ("o", "measured, fitted", [lv for lv in loadtest.levels if lv.users not in held]),
            ("X", "measured, held out", [lv for lv in loadtest.levels if lv.users in held]),
        ):
            if not levels:
                continue
            users = [lv.users for lv in levels]
            ax_x.plot(users, [lv.throughput_per_s for lv in levels], marker, color="black", label=label)
            ax_r.plot(users, [lv.response_time_s * 1e3 for lv in levels], marker, color="black", label=label)
            ax_d.set_prop_cycle(None)
            for name in result.demand_s:
                ax_d.plot(users, [lv.stations[name].demand_s * 1e3 for lv in levels], marker)
    ax_x.set(xlabel="users", ylabel="throughput (req/s)", title="Throughput")
    ax_r.set(xlabel="users", ylabel="response time (ms)", title="Response time (excl. think)")
    ax_d.set(xlabel="users", ylabel="demand (ms)", title="Service demands used")
    for ax in (ax_x, ax_r, ax_d):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
