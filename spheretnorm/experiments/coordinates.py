"""Coordinate check of μP: how far and how fast each layer's features move, against width.

    python scripts/coord_check.py                          # docs/MUP.md's figure and slopes
    python scripts/coord_check.py --widths 64,256 --connections pre_ln,p_spheret --steps 3
    python scripts/coord_check.py --optimizers adamw,muon,adamh,muonh --connections p_spheret,pre_ln \
        --out docs/mup_coord_check_optimizers     # the same check for every optimizer's μP rule
    python scripts/coord_check.py --from_json docs/mup_coord_check_optimizers.json   # its figure again, from the numbers

For every connection, parametrisation (standard, μP with base width the smallest width) and
width, a model of --n_layer layers (heads of --head_dim, so width grows by heads) takes --steps
steps of each of --optimizers (AdamW by default) at one fixed base rate, constant (--lr for AdamW
and every optimizer's AdamW part; the hidden matrices' own rate of Muon, AdamH and MuonH at its
default, or --rates), without clipping (a clip would rescale updates by a
width-dependent gradient norm), on Tiny Shakespeare batches. After every step the same probe
tokens go through the model, and for each layer (the embedding output, each block's output, the
logits) it records

  delta_rms  RMS over tokens and coordinates of h(t) - h(0): how far the features have moved;
  angle      mean over tokens of the angle between h(t) and h(t - 1): the angular velocity of
             the features on the sphere, in radians per step;
  update     (blocks only) the step's own size, mean over the block's hidden matrices and the
             steps of ||(W(t) - W(t - 1)) x|| / ||W(t - 1) x|| on the matrix's probe input x: what
             each optimizer's μP rule keeps width-free (the spectral condition), unmixed with
             the embeddings' AdamW steps, which move every layer's features alike.

Under μP both should stay flat in width (log-log slope near 0); under the standard
parametrisation Adam's per-entry updates add up coherently over the fan-in, so hidden layers
move faster as the model widens (slope up to 1, less once a norm or the angle cap saturates).

Writes OUT.json (every number) and the figure as sheets of at most 12 panels, OUT_<sheet>.png and
.pdf: one sheet per optimizer (OUT_adamw, OUT_muon, ...) where --optimizers names several, else one
per two connections (OUT_pre_ln+geonorm, ...); on each a row per metric, all
its panels on one y-range, and a column per connection and parametrisation (standard, μP). Prints
the fitted slope of each layer's log(metric) against log(width); the slope uses delta_rms at the
last step and the angle averaged over all steps. --from_json OUT.json runs nothing and draws the
sheets again from a record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spheretnorm.model import CONNECTIONS, GPT, SPHERE_CONNECTIONS, GPTConfig
from spheretnorm.mup import param_kind
from spheretnorm.optim import OPTIMIZERS, build_optimizer
from spheretnorm.runtime.config import ConfigError, TrainConfig, parse_value
from spheretnorm.runtime.imports import comma_list, import_modules
from spheretnorm.runtime.loss_terms import loss_term_params
from spheretnorm.runtime.run_folder import LossTermError
from spheretnorm.runtime.step import backward_step
from spheretnorm.experiments.study import DEFAULT_DATA_DIR, ensure_data, study_parser
from spheretnorm.experiments.figures import figure_legend, plt, save_figure, titled_grid
from spheretnorm.runtime.cli import UsageError
from spheretnorm.experiments.grid import parse_choices, parse_numbers
from spheretnorm.runtime.token_files import open_split
from spheretnorm.runtime.batches import EVAL_STREAM, TRAIN_STREAM, batch_offsets, get_batch

DEFAULT_WIDTHS = "64,128,256,512,1024"
DEFAULT_CONNECTIONS = ",".join(("pre_ln", *SPHERE_CONNECTIONS))
PARAMETRISATIONS = ("standard", "mup")
METRICS = ("delta_rms", "angle", "update")
DEFAULT_OUT = "docs/mup_coord_check"


@dataclass(frozen=True)
class Setup:
    """The fixed base hyperparameters of a coordinate check."""

    n_layer: int = 2
    head_dim: int = 32
    block_size: int = 64
    batch_size: int = 8
    steps: int = 5
    lr: float = 3e-3
    weight_decay: float = 0.0
    seed: int = 0
    rates: tuple[tuple[str, float], ...] = ()  # (optimizer, its hidden rate) where not the rate key's default
    loss_keys: tuple[tuple[str, float], ...] = ()  # (a loss term's key, its value): the terms on (runtime/loss_terms.py)

    def train_config(self, optimizer: str) -> TrainConfig:
        """The optimizer's keys: --lr constant (min_lr 0 is never reached: no schedule runs here), its own rate."""
        rate = dict(self.rates).get(optimizer)
        keys = {"learning_rate": self.lr, **({OPTIMIZERS[optimizer].rate_key: rate} if rate is not None else {})}
        return TrainConfig(optimizer=optimizer, min_lr=0.0, weight_decay=self.weight_decay, **keys, **dict(self.loss_keys))

    def model_config(self, connection: str, width: int, base: int, vocab_size: int) -> GPTConfig:
        return GPTConfig(n_layer=self.n_layer, n_head=width // self.head_dim, n_embd=width, vocab_size=vocab_size, block_size=self.block_size,
                         connection=connection, mup_base_width=base, sphere_impl="reference")


def layer_names(n_layer: int) -> list[str]:
    return ["embed", *(f"block {i}" for i in range(1, n_layer + 1)), "logits"]


@torch.no_grad()
def layer_states(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """The embedding output, every block's output and the logits, on idx (hooks, one forward)."""
    states: list[torch.Tensor] = []
    modules = [model.transformer.embed_norm, *model.transformer.h]
    hooks = [m.register_forward_hook(lambda _m, _in, out: states.append(out.detach().float())) for m in modules]
    try:
        logits, _ = model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return states + [logits.float()]


def hidden_linears(model: GPT) -> dict[str, tuple[int, torch.nn.Linear]]:
    """The blocks' hidden matrices (μP's 'hidden' kind) by name, each with its block's number (1-based)."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and param_kind(f"{name}.weight", module.weight) == "hidden":
            found[name] = (int(name.split(".")[2]) + 1, module)  # transformer.h.<i>.attn.c_attn
    return found


@torch.no_grad()
def hidden_inputs(model: GPT, probe: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each hidden matrix's input on the probe tokens (hooks, one forward)."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda _m, args, _out, name=name: inputs.__setitem__(name, args[0].detach().float()))
             for name, (_, m) in hidden_linears(model).items()]
    try:
        model(probe)
    finally:
        for hook in hooks:
            hook.remove()
    return inputs


def update_sizes(model: GPT, before: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> dict[int, float]:
    """Per block: the mean over its hidden matrices of ||(W - W_before) x|| / ||W_before x||."""
    sizes: dict[int, list[float]] = {}
    for name, (block, module) in hidden_linears(model).items():
        x, w0 = inputs[name], before[name]
        sizes.setdefault(block, []).append(((x @ (module.weight.detach().float() - w0).T).norm() / (x @ w0.T).norm()).item())
    return {block: float(np.mean(v)) for block, v in sizes.items()}


def mean_angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over tokens of the angle between the rows of a and b, in radians."""
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)
    return torch.acos(cos.clamp(-1.0, 1.0)).mean().item()


def trace(model: GPT, setup: Setup, batches: list[tuple[torch.Tensor, torch.Tensor]], probe: torch.Tensor,
          optimizer: str = "adamw") -> dict[str, list[list[float]]]:
    """Train `steps` steps on batches; per layer, delta_rms and angle after each step (index t - 1)."""
    train = setup.train_config(optimizer)
    opt = build_optimizer(model, train)
    first = previous = layer_states(model, probe)
    out: dict[str, list[list[float]]] = {m: [[] for _ in first] for m in METRICS}
    for x, y in batches[: setup.steps]:
        inputs = hidden_inputs(model, probe)
        before = {name: m.weight.detach().float().clone() for name, (_, m) in hidden_linears(model).items()}
        opt.zero_grad(set_to_none=True)
        backward_step(model, lambda _: (x, y), train)  # train.py's loss (its terms too); no clip
        opt.step()
        now = layer_states(model, probe)
        for layer, (h0, h_prev, h) in enumerate(zip(first, previous, now)):
            out["delta_rms"][layer].append((h - h0).pow(2).mean().sqrt().item())
            out["angle"][layer].append(mean_angle(h_prev, h))
        sizes = update_sizes(model, before, inputs)
        for layer in range(len(first)):  # the embedding and the logits have no hidden matrix: NaN
            out["update"][layer].append(sizes.get(layer, float("nan")))
        previous = now
    return out


def summary(trace_: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    """Per layer: delta_rms after the last step, angle and update averaged over the steps."""
    averaged = {m: [float(np.mean(series)) for series in trace_[m]] for m in ("angle", "update")}
    return {"delta_rms": [series[-1] for series in trace_["delta_rms"]], **averaged}


def coord_check(connections: list[str], widths: list[int], setup: Setup, vocab_size: int, batches: list[tuple[torch.Tensor, torch.Tensor]],
                probe: torch.Tensor, log: Any = None, optimizers: tuple[str, ...] = ("adamw",)) -> dict[str, Any]:
    """{row: {param: {width: summary}}} for every connection, optimizer, parametrisation and width;
    a row is the connection's name (AdamW alone) or 'connection, optimizer'.

    Every model starts from the seed, so standard and μP at the base width are the same model.
    """
    base = min(widths)
    results: dict[str, Any] = {}
    for optimizer in optimizers:
        for connection in connections:
            row = connection if optimizers == ("adamw",) else f"{connection}, {optimizer}"
            for param in PARAMETRISATIONS:
                for width in widths:
                    torch.manual_seed(setup.seed)
                    model = GPT(setup.model_config(connection, width, base if param == "mup" else 0, vocab_size))
                    results.setdefault(row, {}).setdefault(param, {})[width] = summary(trace(model, setup, batches, probe, optimizer))
                    if log:
                        log(f"{row} {param} width {width}: done")
    return results


def slopes(results: dict[str, Any]) -> dict[str, Any]:
    """{connection: {param: {metric: [slope per layer]}}}: least-squares slope of log metric vs log width."""
    out: dict[str, Any] = {}
    for connection, by_param in results.items():
        for param, by_width in by_param.items():
            widths = sorted(by_width)
            x = np.log(widths)
            fitted = {}
            for metric in (m for m in METRICS if m in by_width[widths[0]]):  # a record written before `update` lacks it
                ys = [[max(by_width[w][metric][layer], 1e-30) for w in widths] for layer in range(len(by_width[widths[0]][metric]))]
                fitted[metric] = [float(np.polyfit(x, np.log(y), 1)[0]) if np.isfinite(y).all() else float("nan") for y in ys]
            out.setdefault(connection, {})[param] = fitted
    return out


# -----------------------------------------------------------------------------
# Data, outputs, command line


def shakespeare_batches(data_dir: Path, setup: Setup) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, int]:
    """Training batches (train split) and probe tokens (val split), drawn as train.py draws them."""
    meta = ensure_data(data_dir)
    train_tokens, val_tokens = open_split(data_dir, "train", meta), open_split(data_dir, "val", meta)

    def draw(tokens: np.ndarray, stream: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = batch_offsets(setup.seed, stream, index, setup.batch_size, len(tokens), setup.block_size)
        return get_batch(tokens, offsets, setup.block_size, "cpu")

    batches = [draw(train_tokens, TRAIN_STREAM, i) for i in range(setup.steps)]
    probe, _ = draw(val_tokens, EVAL_STREAM + 1, 0)
    return batches, probe, int(meta["vocab_size"])


def slope_table(fitted: dict[str, Any], n_layer: int) -> str:
    """Markdown: one row per connection and metric, standard | μP slope per layer."""
    names = layer_names(n_layer)
    lines = ["| connection | metric | " + " | ".join(names) + " |", "|:--|:--|" + "--:|" * len(names)]
    for connection, by_param in fitted.items():
        for metric in METRICS:
            if metric not in by_param["standard"]:
                continue
            cells = [f"{by_param['standard'][metric][i]:+.2f} / {by_param['mup'][metric][i]:+.2f}"
                     if np.isfinite(by_param["standard"][metric][i]) else "-" for i in range(len(names))]
            lines.append(f"| {connection} | {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


MAX_SHEET_PANELS = 12  # panels on one sheet of the figure: the 48 of one file could not be read
MAX_SHEET_COLUMNS = 4  # two connections, standard and μP: a sheet wider than this is read as a strip
SHEET_PANEL_INCHES = (3.4, 2.6)
METRIC_LABELS = {"delta_rms": "delta_rms\n(RMS of h(t) - h(0))", "angle": "angle\n(radians per step)", "update": "update\n(||dW x|| / ||W x||)"}


@dataclass(frozen=True)
class Sheet:
    """One file of the figure: some rows of the results (a connection, or 'connection, optimizer')."""

    suffix: str  # of the file's name: OUT_<suffix>.png
    rows: tuple[str, ...]
    optimizer: str | None  # the one optimizer of its rows, where the check had several (its rows then name it)


def row_parts(row: str) -> tuple[str, str | None]:
    """'p_spheret, muon' -> ('p_spheret', 'muon'); a check of AdamW alone names the connection only."""
    connection, _, optimizer = row.partition(", ")
    return connection, optimizer or None


def result_metrics(results: dict[str, Any]) -> list[str]:
    """The METRICS the results hold (a record written before `update` existed has two)."""
    summary_ = next(iter(next(iter(next(iter(results.values())).values())).values()))
    return [m for m in METRICS if m in summary_]


def even_chunks(items: list[str], most: int) -> list[list[str]]:
    """items in as few chunks of at most `most` as possible, their sizes differing by one at most."""
    count = -(-len(items) // most)
    size = -(-len(items) // count)
    return [items[i:i + size] for i in range(0, len(items), size)]


def coord_sheets(results: dict[str, Any]) -> list[Sheet]:
    """The sheets of the figure: one per optimizer where the check had several, each split (and
    otherwise the connections split) so that no sheet has more than MAX_SHEET_PANELS panels nor
    MAX_SHEET_COLUMNS columns: a row per metric, a column per connection and parametrisation."""
    per_sheet = max(1, min(MAX_SHEET_COLUMNS, MAX_SHEET_PANELS // len(result_metrics(results))) // len(PARAMETRISATIONS))
    by_optimizer: dict[str | None, list[str]] = {}
    for row in results:
        by_optimizer.setdefault(row_parts(row)[1], []).append(row)
    sheets = []
    for optimizer, rows in by_optimizer.items():
        chunks = even_chunks(rows, per_sheet)
        for chunk in chunks:
            connections = "+".join(row_parts(r)[0] for r in chunk) if len(chunks) > 1 or optimizer is None else ""
            sheets.append(Sheet("_".join(filter(None, (optimizer, connections))), tuple(chunk), optimizer))
    return sheets


def check_title(setup: Setup, optimizers: tuple[str, ...], base: int) -> str:
    def rate(o: str) -> str:
        key = OPTIMIZERS[o].rate_key
        return f"{OPTIMIZERS[o].title} {key}={getattr(setup.train_config(o), key):g}"

    steps = (f"{setup.steps} AdamW steps at lr {setup.lr:g}" if optimizers == ("adamw",)
             else f"{setup.steps} steps; {', '.join(map(rate, optimizers))} (AdamW's part {setup.lr:g})")
    return f"Coordinate check: {setup.n_layer} layers, {steps} (μP base width {base}); standard vs μP"


def plot_coord_check(results: dict[str, Any], setup: Setup, optimizers: tuple[str, ...], out: Path) -> list[Path]:
    """The figure as sheets (coord_sheets), each OUT_<suffix>.{png,pdf}; returns the files written."""
    base = min(w for by_param in results.values() for by_width in by_param.values() for w in by_width)
    paths = []
    for sheet in coord_sheets(results):
        title = check_title(setup, (sheet.optimizer,) if sheet.optimizer else optimizers, base)
        paths += save_figure(sheet_figure(results, sheet, setup.n_layer, title), out.with_name(f"{out.name}_{sheet.suffix}"))
    return paths


def sheet_figure(results: dict[str, Any], sheet: Sheet, n_layer: int, title: str) -> plt.Figure:
    """A row per metric, a column per (row of the sheet, parametrisation), a line per layer. Each
    metric's panels share one y-range, so that slopes and levels compare by eye across them."""
    metrics = result_metrics(results)
    columns = [(row, param) for row in sheet.rows for param in PARAMETRISATIONS]
    fig, axes = titled_grid(len(metrics), len(columns), SHEET_PANEL_INCHES, title, sharey="row")
    for i, metric in enumerate(metrics):
        for j, (row, param) in enumerate(columns):
            draw_layers(axes[i][j], results[row][param], metric, layer_names(n_layer))
        axes[i][0].set_ylabel(METRIC_LABELS[metric], fontsize=9)
    for j, (row, param) in enumerate(columns):
        axes[0][j].set_title(f"{row_parts(row)[0]}, {'μP' if param == 'mup' else 'standard'}", fontsize=10)
        axes[-1][j].set_xlabel("width n_embd")
    figure_legend(fig, axes)
    return fig


def draw_layers(ax: Any, by_width: dict[int, dict[str, list[float]]], metric: str, names: list[str]) -> None:
    """A line per layer of `metric` against width, log-log; a layer without it (update: blocks only) has none."""
    widths = sorted(by_width)
    cmap = plt.get_cmap("viridis")
    for layer, name in enumerate(names):
        ys = [by_width[w][metric][layer] for w in widths]
        if np.isfinite(ys).all():
            ax.plot(widths, ys, marker="o", markersize=4, color=cmap(layer / max(1, len(names) - 1) * 0.9), label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.tick_params(axis="x", which="minor", bottom=False)
    ax.grid(alpha=0.3, which="both")


def load_record(path: Path) -> tuple[Setup, tuple[str, ...], dict[str, Any]]:
    """(setup, optimizers, results) of a check's OUT.json, its widths as integers again (JSON made
    them strings); a record without 'optimizers' (written before it was kept) names them in its rows."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        keys = record["setup"]
        setup = Setup(**{**keys, **{k: tuple(tuple(pair) for pair in keys.get(k, ())) for k in ("rates", "loss_keys")}})
        results = {row: {param: {int(w): s for w, s in by_width.items()} for param, by_width in by_param.items()}
                   for row, by_param in record["results"].items()}
    except FileNotFoundError:
        raise UsageError(f"--from_json {path} does not exist; give the OUT.json a coordinate check wrote.") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"--from_json {path} is not a coordinate check's record ({type(e).__name__}: {e}).") from None
    optimizers = tuple(record.get("optimizers") or dict.fromkeys(row_parts(r)[1] or "adamw" for r in results))
    return setup, optimizers, results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Setup()
    p = study_parser(__doc__)
    p.add_argument("--widths", default=DEFAULT_WIDTHS, help=f"widths; the smallest is μP's base (default: {DEFAULT_WIDTHS})")
    p.add_argument("--connections", default=DEFAULT_CONNECTIONS, help=f"comma-separated connections (default: {DEFAULT_CONNECTIONS})")
    p.add_argument("--n_layer", type=int, default=defaults.n_layer, help=f"depth (default {defaults.n_layer})")
    p.add_argument("--head_dim", type=int, default=defaults.head_dim, help=f"width of one head (default {defaults.head_dim})")
    p.add_argument("--optimizers", default="adamw", help="comma-separated optimizers (spheretnorm/optim.py), each with its μP rule (default: adamw)")
    p.add_argument("--steps", type=int, default=defaults.steps, help=f"optimizer steps (default {defaults.steps})")
    p.add_argument("--lr", type=float, default=defaults.lr, help=f"AdamW's learning rate (and every optimizer's AdamW part), constant (default {defaults.lr:g})")
    p.add_argument("--rates", default="", help="OPT=RATE,...: an optimizer's hidden-matrix rate (muon_lr, hyperball_lr), default: its key's default")
    p.add_argument("--loss_keys", default="", help="KEY=VALUE,...: loss terms' keys, the older form of --KEY=VALUE (a term's keys are given as train.py takes them: --z_loss=1e-4)")
    p.add_argument("--imports", default="", help="comma-separated modules of your own to import first (a loss term or connection they register)")
    p.add_argument("--batch_size", type=int, default=defaults.batch_size, help=f"sequences per step (default {defaults.batch_size})")
    p.add_argument("--data_dir", default=str(DEFAULT_DATA_DIR), help="prepared shakespeare_char data (prepared when missing)")
    p.add_argument("--out", default=None, help=f"output path without extension (default: {DEFAULT_OUT}; with --from_json, the record's path without .json)")
    p.add_argument("--from_json", metavar="OUT.json", help="run nothing: redraw the figure's sheets from the record a check wrote")
    args, rest = p.parse_known_args(argv)
    args.train_keys = rest  # --KEY=VALUE of a loss term (--z_loss=1e-4), as train.py and bench.py take them (key_pairs)
    return args


def key_pairs(rest: list[str]) -> tuple[tuple[str, float], ...]:
    """The --KEY=VALUE arguments argparse did not know: each a key a registered loss term declares
    (the training keys a coordinate check has), as train.py would read it; anything else is one line."""
    declared = loss_term_params()
    pairs = []
    for arg in rest:
        key, eq, value = arg.removeprefix("--").partition("=")
        if not (arg.startswith("--") and eq):
            raise UsageError(f"{arg!r} is not an option of the coordinate check; loss-term keys are given as --KEY=VALUE (see --help).")
        if key not in declared:
            raise UsageError(f"--{key} is not an option of the coordinate check nor a key a registered loss term declares "
                             f"(registered: {', '.join(declared) or 'none'}; one of your own needs --imports).")
        try:
            pairs.append((key, declared[key].checked(parse_value(key, value))))
        except (ConfigError, ValueError) as e:
            raise UsageError(f"--{key}: {e}") from None
    return tuple(pairs)


def check_optimizers(optimizers: tuple[str, ...], setup: "Setup", connections: list[str], widths: list[int]) -> None:
    """Each optimizer's own check of the models the check builds (μP at the widest, the narrowest as
    its base), as train.py makes it: Lion of one's own under μP is refused here as there."""
    for optimizer in optimizers:
        for connection in connections:
            try:
                OPTIMIZERS[optimizer].check(setup.model_config(connection, max(widths), min(widths), 64), setup.train_config(optimizer))
            except (ConfigError, ValueError) as e:
                raise UsageError(f"--optimizers {optimizer}: {e}") from None


def parse_loss_keys(text: str) -> tuple[tuple[str, float], ...]:
    """--loss_keys 'z_loss=1e-4' as ((key, value), ...), each a key a registered loss term declares."""
    declared = loss_term_params()
    pairs = [item.strip().partition("=") for item in text.split(",") if item.strip()]
    unknown = [key for key, _, _ in pairs if key not in declared]
    if unknown:
        raise UsageError(f"--loss_keys names {unknown[0]!r}, which no registered loss term declares (registered: {', '.join(declared) or 'none'}; one of your own needs --imports).")
    try:
        return tuple((key, parse_value(key, value)) for key, _, value in pairs)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def parse_rates(text: str, optimizers: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """--rates 'muon=0.02,muonh=0.05' as ((optimizer, rate), ...), each optimizer one of --optimizers."""
    pairs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        if name not in optimizers:
            raise UsageError(f"--rates names {name!r}, which is not one of --optimizers ({', '.join(optimizers)}).")
        try:
            pairs.append((name, float(value)))
        except ValueError:
            raise UsageError(f"--rates {item!r} is not OPTIMIZER=RATE (a number), e.g. muon=0.02.") from None
    return tuple(pairs)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    import_modules(comma_list(args.imports), "--imports", UsageError)  # before --connections and --loss_keys name their entries
    widths = parse_numbers(args.widths, int, "widths")
    connections = parse_choices(args.connections, CONNECTIONS, "connections")
    if any(w % args.head_dim for w in widths) or len(widths) < 2:
        raise UsageError(f"--widths {args.widths!r} must name two or more multiples of --head_dim {args.head_dim}.")
    if args.steps < 1 or args.n_layer < 1:
        raise UsageError(f"--steps {args.steps} and --n_layer {args.n_layer} must be positive integers.")
    optimizers = tuple(parse_choices(args.optimizers, OPTIMIZERS, "optimizers"))
    rates = parse_rates(args.rates, optimizers)
    setup = Setup(n_layer=args.n_layer, head_dim=args.head_dim, steps=args.steps, lr=args.lr, batch_size=args.batch_size, rates=rates,
                  loss_keys=parse_loss_keys(args.loss_keys) + key_pairs(getattr(args, "train_keys", [])))
    check_optimizers(optimizers, setup, connections, widths)
    batches, probe, vocab = shakespeare_batches(Path(args.data_dir), setup)
    results = coord_check(connections, widths, setup, vocab, batches, probe, log=lambda s: print(s, flush=True), optimizers=optimizers)
    fitted = slopes(results)
    title = check_title(setup, optimizers, min(widths))
    out = Path(args.out or DEFAULT_OUT)
    figures = plot_coord_check(results, setup, optimizers, out)
    table = slope_table(fitted, setup.n_layer)
    record = {"setup": setup.__dict__, "optimizers": list(optimizers), "widths": widths, "layers": layer_names(setup.n_layer),
              "results": results, "slopes": fitted}
    out.with_suffix(".json").write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"\n{title}\nSlopes of log(metric) against log(width), standard / μP:\n\n{table}\n")
    print(f"{time.perf_counter() - started:.0f} s. Written: " + ", ".join(str(p) for p in [out.with_suffix('.json'), *figures]))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not args.from_json:
            return run(args)
        setup, optimizers, results = load_record(Path(args.from_json))  # the figure of a finished check, from its record alone
        figures = plot_coord_check(results, setup, optimizers, Path(args.out or Path(args.from_json).with_suffix("")))
        print("Written: " + ", ".join(map(str, figures)))
        return 0
    except (UsageError, LossTermError) as e:  # a loss term of --imports that raises or returns no scalar: one line too
        print(f"error: {e}", file=sys.stderr)
        return 2
