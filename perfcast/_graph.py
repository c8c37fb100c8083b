"""``perfcast graph``: spans file -> causal graphs file, a table per route/variant, the self-check."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from analyzer.graph import CausalGraph

_MAX_WARNINGS = 10


@click.command("graph")
@click.argument("spans_file", metavar="SPANS", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("graphs.json"),
              show_default=True, help="Where to write the graphs file.")
@click.option("--dot", type=click.Path(dir_okay=False, path_type=Path), help="Also write Graphviz text here.")
@click.option("--strict", is_flag=True, help="Any malformed line or incomplete request is an error.")
@click.option("--check", is_flag=True,
              help="Fail (exit 2) unless the self-check's median error is under --tolerance.")
@click.option("--tolerance", type=float, default=0.05, show_default=True,
              help="Median relative self-check error allowed by --check.")
@click.option("--nodes/--no-nodes", "show_nodes", default=True, help="List each variant's nodes.")
@click.option("--fold-waits", is_flag=True,
              help="Fold unattributed waits (locks, pools, queues) into compute: fewer, larger variants.")
@click.option("--verbose", "-v", is_flag=True, help=f"Print every warning (default: the first {10}).")
def graph(spans_file: Path, output: Path, dot: Path | None, strict: bool, check: bool, tolerance: float,
          show_nodes: bool, fold_waits: bool, verbose: bool) -> None:
    """Build causal graphs (one per route and causal shape) from a spans file and self-check them."""
    import numpy as np
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.tree import Tree

    from analyzer.build import build_graphs
    from analyzer.graph import NodeKind, dump_graphs, to_dot
    from analyzer.loadsim import background_from_spans
    from analyzer.selfcheck import self_check
    from analyzer.spans import process_cpu, read_spans, sampling_windows

    out, err = Console(), Console(stderr=True)
    spans = read_spans(spans_file, strict=strict)
    problems = list(spans.problems)
    graphs = build_graphs(spans, fold_waits=fold_waits, problems=None if strict else problems)
    shown = problems if verbose else problems[:_MAX_WARNINGS]
    for problem in shown:
        err.print(f"[yellow]warning:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if len(shown) < len(problems):
        err.print(f"[yellow]warning:[/] ... and {len(problems) - len(shown)} more (--verbose shows all)",
                  highlight=False)
    graphs, background = background_from_spans(graphs, spans.requests, process_cpu(spans.spans))
    dump_graphs(graphs, output, source=str(spans_file))
    if dot is not None:
        dot.write_text(to_dot(graphs), encoding="utf-8")

    table = Table(title=f"{len(spans.requests)} requests, {len(graphs)} variants -> {output}")
    for col, justify in [("route", "left"), ("variant", "right"), ("count", "right"), ("nodes", "right"),
                         ("io calls", "right"), ("p50 ms", "right"), ("p99 ms", "right"),
                         ("self-check median", "right")]:
        table.add_column(col, justify=justify, no_wrap=col == "route")  # type: ignore[arg-type]
    errors = []
    for g in graphs:
        e = self_check(g)
        errors.append(e)
        lat = np.asarray(g.latency_ms)
        table.add_row(g.route, str(g.variant), str(g.count), str(len(g.nodes)),
                      str(sum(n.kind is NodeKind.IO for n in g.nodes)), f"{np.median(lat):.2f}",
                      f"{np.quantile(lat, 0.99):.2f}", f"{np.median(e):.2%}")
    out.print(table)
    if background is not None:
        out.print(f"process CPU per request {background.process_ms:.2f} ms, of which the graphs record "
                  f"{background.traced_ms:.2f} ms: {background.background_ms:.2f} ms of background CPU "
                  "(other threads, the kernel) kept for load predictions", highlight=False)
        if background.host_ms is not None:
            out.print(f"the host's CPU per request {background.host_ms:.2f} ms over its {background.host_cpus} CPUs "
                      "(the app and every other process on it): load predictions say how busy they would be",
                      highlight=False)
    windows = sampling_windows(spans.spans)
    if windows:
        seconds = sum(w.end_ns - w.start_ns for w in windows) / 1e9
        out.print(f"sampled collection: {len(spans.requests)} requests recorded in {len(windows)} windows "
                  f"({seconds:.1f} s); process CPU is not divided among them (load predictions use the "
                  "recorded compute only)", highlight=False)
    if show_nodes:
        for g in graphs:
            tree = Tree(f"[bold]{escape(g.route)}[/] variant {g.variant} ({g.count} requests)")
            for task, line in _task_lines(g):
                tree.add(f"[cyan]{escape(task)}[/] {escape(line)}", highlight=False)
            out.print(tree, highlight=False)
    overall = np.concatenate(errors) if errors else np.zeros(0)
    if overall.size:
        out.print(f"self-check |evaluated - observed| / observed over {overall.size} requests: "
                  f"median {np.median(overall):.2%}, p90 {np.quantile(overall, 0.9):.2%}, max {overall.max():.2%}")
    if check and (overall.size == 0 or float(np.median(overall)) >= tolerance):
        err.print(f"self-check failed: median error {np.median(overall) if overall.size else float('nan'):.2%} "
                  f"is not under {tolerance:.2%}")
        raise SystemExit(2)


def _task_lines(g: CausalGraph) -> list[tuple[str, str]]:
    """One compact line per task of a variant: its I/O, sync, timer and wait nodes in order, with medians."""
    import numpy as np

    from analyzer.graph import NodeKind, WaitMode

    lines: dict[str, list[str]] = {}
    compute: dict[str, float] = {}
    for node_id in g.topological_order():
        node = g.node(node_id)
        if not node.task:
            continue
        med = float(np.median(node.samples_ms)) if node.samples_ms else 0.0
        parts = lines.setdefault(node.task, [])
        if node.kind is NodeKind.COMPUTE:
            compute[node.task] = compute.get(node.task, 0.0) + med
            continue
        name = node_id[len(node.task) + 1:]
        what = node.api or node.label
        if node.wait is WaitMode.ANY:
            what += " any" if node.k == 1 else f" {node.k}-th"
        parts.append(f"{name} {what} {med:.2f}")
    return [(task, f"compute {compute.get(task, 0.0):.2f} ms | " + " -> ".join(parts)) for task, parts in lines.items()]
