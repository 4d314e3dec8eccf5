"""The optimizers, by name: one table (OPTIMIZERS) beside the connection and retraction registries.

An entry is a class registered with @register_optimizer("name"). It declares its own keys
(`params`, MethodParam as a connection's are: --muon_lr=0.02, kept in
TrainConfig.optimizer_params) and builds one Optimizers object that owns every trainable
parameter of the model. Everything that trains or restores a model (train.py, the sharded
checkpoint's consolidation, bench.py, the coordinate check, the studies) calls build_optimizer
and sees one object with param_groups, step, zero_grad, state_dict and load_state_dict.

Four entries ship:
- adamw: AdamW with the connection's rules (Connection.optimizer_rule) and μP's group factors,
  exactly the optimizer the paper trains with (one torch.optim.AdamW, two groups without μP).
- muon: Muon (Nesterov momentum, then the update's Newton-Schulz orthogonalisation) for the
  hidden 2-D matrices (mup.param_kind 'hidden'), AdamW as above for everything else
  (embeddings, LM head, gains, biases, scalars).
- adamh, muonh: the Hyperball (Wen et al.): Adam's or Muon's direction as a step of fixed norm
  on each hidden matrix's Frobenius sphere of fixed radius; AdamW for the rest.
docs/OPTIMIZERS.md writes out the equations and every choice the papers leave open.

A recipe sets each group's "lr" to the peak rate it means (Muon's: muon_lr, μP's factors
included); build_optimizer stamps it as the group's "peak_lr", and the schedule
(runtime/schedule.py) scales that peak by its warm-up and decay. A resume re-applies the current
settings' groups over the checkpoint's (apply_group_settings), except the keys a recipe declares
`resume_fixed`, whose change is refused.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Iterator, Protocol

import torch
import torch.nn as nn

from .model import CONNECTIONS, KEYED_REGISTRIES, Connection, MethodParam, check_registration
from .mup import lr_scale, param_kind

# Newton-Schulz's quintic coefficients (K. Jordan's Muon; torch.optim.Muon's defaults): they
# maximise the slope at zero, so 5 steps bring every singular value into about [0.7, 1.2].
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
ADAM_EPS = 1e-8  # torch's AdamW default, which the AdamW part uses too
MUON_SHAPE_SCALES = ("original", "match_rms_adamw", "none")


class OptimizerSettings(Protocol):
    """What an optimizer is built from: TrainConfig's optimizer keys (runtime/config/train_config.py)."""

    optimizer: str
    learning_rate: float
    weight_decay: float
    beta1: float
    beta2: float
    optimizer_params: dict[str, Any]


# -----------------------------------------------------------------------------
# The container: one object over one or more torch optimizers


class Optimizers:
    """Every parameter group of the model under one object (the container pattern of nanochat's
    MuonAdamW and torchtitan's OptimizersContainer). With one inner optimizer its state_dict is
    that optimizer's own, so checkpoints of the single-AdamW trainer load unchanged."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        if not optimizers:
            raise ValueError("an Optimizers object needs at least one optimizer")
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers for group in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        if len(self.optimizers) == 1:
            return self.optimizers[0].state_dict()
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state that state_dict wrote; a state of another optimizer is a ValueError."""
        states = [state] if len(self.optimizers) == 1 else state.get("optimizers")
        if not isinstance(states, list) or len(states) != len(self.optimizers):
            raise ValueError(f"the state holds {len(states) if isinstance(states, list) else 'no list of'} optimizer states, this optimizer has {len(self.optimizers)}")
        for opt, s in zip(self.optimizers, states):
            opt.load_state_dict(s)

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers)


# -----------------------------------------------------------------------------
# The table


class OptimizerRecipe:
    """Base of every entry of OPTIMIZERS: build(model, settings, device_type) -> Optimizers."""

    title = ""  # the name in tables and messages
    params: tuple[MethodParam, ...] = ()  # the training keys of this optimizer (shared ones: the same MethodParam)
    rate_key = "learning_rate"  # the key that sets the hidden matrices' peak rate (what a rate sweep moves)
    # Keys whose value the optimizer keeps in its state from the first step on (the Hyperball's
    # radius): a resume cannot apply a change to them, so it refuses one.
    resume_fixed: tuple[str, ...] = ()
    mup_step: str | None = None  # how it moves hidden matrices (a key of mup.HIDDEN_LR_EXPONENTS); None: no μP rule

    @classmethod
    def build(cls, model: nn.Module, settings: OptimizerSettings, device_type: str) -> Optimizers:
        raise NotImplementedError

    @classmethod
    def hidden_step(cls, params: dict[str, Any]) -> str | None:
        """The μP rule of the hidden matrices under these keys (Muon's depends on its shape factor)."""
        return cls.mup_step

    @classmethod
    def check(cls, model_config: Any, settings: OptimizerSettings) -> None:
        """Raise a ValueError naming the key if this optimizer cannot train model_config."""
        if getattr(model_config, "mup_base_width", 0) and cls.hidden_step(settings.optimizer_params) is None:
            raise ValueError(
                f"mup_base_width={model_config.mup_base_width} asks for μP, which has no rule for optimizer "
                f"{settings.optimizer!r} (docs/MUP.md); use optimizer={'|'.join(n for n, c in OPTIMIZERS.items() if c.mup_step)} or mup_base_width=0."
            )


OPTIMIZERS: dict[str, type[OptimizerRecipe]] = {}
KEYED_REGISTRIES["optimizer"] = OPTIMIZERS  # its names and keys checked with the connections'


def register_optimizer(name: str) -> Callable[[type[OptimizerRecipe]], type[OptimizerRecipe]]:
    """Class decorator: make an OptimizerRecipe available as --optimizer=name. A built-in's name,
    or a key of the model, of training or of another optimizer, is refused (model.check_registration)."""

    def wrap(cls: type[OptimizerRecipe]) -> type[OptimizerRecipe]:
        if not (isinstance(cls, type) and issubclass(cls, OptimizerRecipe)):
            raise TypeError(f"@register_optimizer({name!r}) needs an OptimizerRecipe subclass, got {cls!r}")
        check_registration("optimizer", name, cls, __name__)
        OPTIMIZERS[name] = cls
        return cls

    return wrap


def optimizer_params() -> dict[str, MethodParam]:
    """Every registered optimizer's declared keys, by key."""
    return {p.key: p for cls in OPTIMIZERS.values() for p in cls.params}


def resolve_optimizer_params(optimizer: str, given: dict[str, Any]) -> dict[str, Any]:
    """The keys `optimizer` declares, given values checked, the rest at their defaults; another
    optimizer's key is refused in one sentence."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {optimizer!r}; valid optimizers are: {', '.join(OPTIMIZERS)}.")
    own = {p.key: p for p in OPTIMIZERS[optimizer].params}
    foreign = sorted(k for k in given if k not in own)
    if foreign:
        owners = [n for n, c in OPTIMIZERS.items() if any(p.key == foreign[0] for p in c.params)]
        owner = owners[0] if owners else None
        whose = f"a key of optimizer {' and '.join(repr(n) for n in owners)}" if owners else "no optimizer's key"
        raise ValueError(
            f"{foreign[0]} is {whose}, not of optimizer {optimizer!r} (its keys: {', '.join(own) or 'none'}); "
            f"drop it or set optimizer={owner or optimizer}."
        )
    return {key: param.checked(given.get(key, param.default)) for key, param in own.items()}


def build_optimizer(model: nn.Module, settings: OptimizerSettings, device_type: str = "cpu") -> Optimizers:
    """The optimizer that `settings.optimizer` names, over every trainable parameter of `model`
    (a GPT, or its FSDP-sharded form: the groups are by parameter name and kind either way)."""
    if settings.optimizer not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {settings.optimizer!r}; valid optimizers are: {', '.join(OPTIMIZERS)}.")
    optimizers = OPTIMIZERS[settings.optimizer].build(model, settings, device_type)
    check_groups(model, optimizers)
    stamp_peak_rates(optimizers)
    return optimizers


PEAK_LR = "peak_lr"  # a group's peak rate, which the schedule scales (runtime/schedule.py)


def stamp_peak_rates(optimizers: Optimizers) -> None:
    """Each group's rate as its recipe built it is its peak: the schedule scales it, so a recipe
    sets the rates it means and nothing else."""
    for group in optimizers.param_groups:
        group[PEAK_LR] = group["lr"]


def group_settings(optimizers: Optimizers) -> list[dict[str, Any]]:
    """Every group's hyperparameters (all but its parameters), as the current settings built them."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizers.param_groups]


def apply_group_settings(optimizers: Optimizers, settings: list[dict[str, Any]]) -> None:
    """Put `settings` (group_settings of a fresh build) over groups a checkpoint's state replaced:
    load_state_dict restores the saved groups whole, so without this a resume would train with
    the checkpoint's rates, betas and decay whatever the command line says."""
    for group, fresh in zip(optimizers.param_groups, settings, strict=True):
        if "lr_scale" not in fresh:  # an earlier commit's factor of a group that no longer has one
            group.pop("lr_scale", None)
        group.update(fresh)


def refused_resume_change(settings: OptimizerSettings, saved_params: dict[str, Any]) -> str | None:
    """The one-sentence refusal of a changed key whose value lives in the optimizer's state
    (OptimizerRecipe.resume_fixed), or None; saved_params: the checkpoint's optimizer_params."""
    recipe, keys = OPTIMIZERS[settings.optimizer], settings.optimizer_params
    changed = [k for k in recipe.resume_fixed if k in saved_params and saved_params[k] != keys[k]]
    if not changed:
        return None
    k = changed[0]
    return (
        f"Refusing to resume with {k}={keys[k]!r}: the checkpoint's optimizer state holds the value it was trained with, "
        f"{saved_params[k]!r}, which a resume cannot change; pass --{k}={saved_params[k]}, or --fresh_optimizer=true to start a new optimizer state."
    )


def check_groups(model: nn.Module, optimizers: Optimizers) -> None:
    """Every trainable parameter in exactly one group."""
    params = [p for p in model.parameters() if p.requires_grad]
    ids = [id(p) for g in optimizers.param_groups for p in g["params"]]
    assert len(ids) == len(params), "a parameter is in no group"
    assert len(set(ids)) == len(ids), "a parameter is in two groups"
    assert set(ids) == {id(p) for p in params}, "a group holds a parameter the model does not train"


# -----------------------------------------------------------------------------
# AdamW: the paper's optimizer


def adamw_groups(model: nn.Module, named: list[tuple[str, nn.Parameter]], weight_decay: float, learning_rate: float) -> list[dict[str, Any]]:
    """AdamW's groups over `named` parameters, at peak rates learning_rate (a recipe passes its own
    rate) times the connection's rule (decay, LR factor) and μP's factor of each parameter's kind;
    equal (decay, factor) make one group, in first-seen order. "lr_scale" keeps the factor
    unrounded: the schedule uses it where it is the peak in units of the run's learning_rate."""
    config = model.config
    connection = CONNECTIONS[config.connection]
    ratio = config.mup_ratio
    grouped: dict[tuple[bool, float], list[nn.Parameter]] = {}
    for name, p in named:
        rule = connection.optimizer_rule(name, p)
        scale = lr_scale(param_kind(name, p), ratio) if ratio != 1.0 else 1.0
        grouped.setdefault((rule.decay, scale * rule.lr_factor), []).append(p)
    return [
        {"params": ps, "weight_decay": weight_decay if decayed else 0.0, "lr": learning_rate * scale, "lr_scale": scale}
        for (decayed, scale), ps in grouped.items()
    ]


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def make_adamw(groups: list[dict[str, Any]], settings: OptimizerSettings, device_type: str) -> torch.optim.AdamW:
    # The fused kernel on CUDA (one launch for all parameters); elsewhere torch's default.
    fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    extra = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=settings.learning_rate, betas=(settings.beta1, settings.beta2), **extra)


@register_optimizer("adamw")
class AdamW(OptimizerRecipe):
    """AdamW (beta1, beta2, weight_decay) on every parameter: the paper's, decay on matrices and
    embeddings only (nGPT: none); under μP a group's rate is learning_rate x its kind's factor."""

    title = "AdamW"
    mup_step = "adam"

    @classmethod
    def build(cls, model: nn.Module, settings: OptimizerSettings, device_type: str) -> Optimizers:
        groups = adamw_groups(model, trainable(model), settings.weight_decay, settings.learning_rate)
        return Optimizers([make_adamw(groups, settings, device_type)])


# -----------------------------------------------------------------------------
# Muon


def newton_schulz(g: torch.Tensor, steps: int, dtype: torch.dtype, eps: float = NS_EPS) -> torch.Tensor:
    """The orthogonal factor of g (U V^T of g = U S V^T), approximately: X = g / ||g||_F, then
    `steps` quintic iterations X <- a X + (b A + c A^2) X with A = X X^T, on the wide side of g
    (so A is the smaller Gram matrix). Returned in g's dtype."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if tall else x).to(g.dtype)


def shape_scale(rule: str, shape: torch.Size) -> float:
    """The factor on Muon's rate for a (fan_out, fan_in) matrix. original: sqrt(max(1, out / in))
    (an orthogonal update's RMS-to-RMS norm is then that of a square one); match_rms_adamw:
    0.2 sqrt(max(out, in)) (the update's RMS matches AdamW's typical 0.2); none: 1."""
    fan_out, fan_in = shape[0], shape[1]
    if rule == "original":
        return math.sqrt(max(1.0, fan_out / fan_in))
    if rule == "match_rms_adamw":
        return 0.2 * math.sqrt(max(fan_out, fan_in))
    return 1.0


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole matrix of a tensor that FSDP2 shards across ranks (DTensor), else t itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def like_param(update: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The whole-matrix `update` laid out as p is: this rank's shard of it for a DTensor (every
    rank holds the same update, so each takes its own rows with no communication)."""
    if not hasattr(p, "full_tensor"):
        return update
    from torch.distributed.tensor import distribute_tensor  # only sharded runs pay its import

    return distribute_tensor(update, p.device_mesh, p.placements, src_data_rank=None)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (sharing its storage: in-place ops update the parameter), else t."""
    return t.to_local() if hasattr(t, "to_local") else t


def frobenius(t: torch.Tensor) -> torch.Tensor:
    """||t||_F of the whole matrix as a plain 0-d tensor: for a DTensor, a reduction over the ranks
    that hold its shards (DTensor's norm), so every rank gets the same value."""
    norm = torch.linalg.vector_norm(t)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class Muon(torch.optim.Optimizer):
    """Muon on 2-D matrices, the maths of torch.optim.Muon (K. Jordan et al.):

        B <- mu B + (1 - mu) G                       (momentum, an EMA)
        U  = (1 - mu) G + mu B  (Nesterov)  or  B
        W <- (1 - lr wd) W - lr s(shape) NS_k(U)

    Under FSDP2 the orthogonalisation is of the whole matrix: each rank gathers U, runs
    Newton-Schulz on it and keeps its own shard, so the step equals one process's. NS runs in
    bf16 on CUDA (where the matmuls are fast) and in the matrix's dtype elsewhere."""

    def __init__(self, params: Any, lr: float, weight_decay: float, momentum: float, nesterov: bool,
                 ns_steps: int, shape_rule: str, ns_dtype: torch.dtype | None = None, **extra: Any):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, shape_rule=shape_rule, **extra)
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        assert closure is None, f"{type(self).__name__} takes no closure"
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.move(p, self.orthogonal_update(p, group), group)

    def orthogonal_update(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """NS_k of the (Nesterov) momentum, of the whole matrix (gathered under FSDP2)."""
        mu = group["momentum"]
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf = state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - mu)
        u = p.grad.lerp(buf, mu) if group["nesterov"] else buf
        full = whole(u)
        return newton_schulz(full, group["ns_steps"], self.ns_dtype or full.dtype)

    def move(self, p: torch.Tensor, ortho: torch.Tensor, group: dict[str, Any]) -> None:
        """Muon's: decoupled decay, then the shape-scaled step."""
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(like_param(ortho, p), alpha=-group["lr"] * shape_scale(group["shape_rule"], ortho.shape))


# -----------------------------------------------------------------------------
# Hyperball (Wen, Dang, Lyu, Ma, Liang): each covered matrix on a Frobenius sphere of fixed radius


HYPERBALL_EPS = 1e-12  # a floor on the norms divided by (a zero update leaves W where it is)


def hyperball_radius(state: dict[str, Any], p: torch.Tensor, radius: float) -> torch.Tensor:
    """R of p, fixed at its first step and kept in the optimizer state (so a resume keeps it):
    radius 0 is p's norm then (its initial one); radius r > 0 is r sqrt(fan_out), the norm of a
    matrix whose entries have std r / sqrt(fan_in), and p is rescaled onto it."""
    if "radius" not in state:
        norm = frobenius(p)
        if radius == 0:
            state["radius"] = norm.clone()
        else:
            state["radius"] = torch.tensor(radius * math.sqrt(p.shape[0]), dtype=norm.dtype, device=norm.device)
            local(p).mul_(state["radius"] / norm.clamp(min=HYPERBALL_EPS))
    return state["radius"]


def hyperball_step(p: torch.Tensor, direction: torch.Tensor, direction_norm: torch.Tensor, radius: torch.Tensor, lr: float) -> None:
    """W <- R Norm(W - lr R D / ||D||_F): a step of norm lr R along the direction D, then back onto
    the sphere of radius R (Norm(X) = X / ||X||_F). Elementwise on this rank's shard, with the
    whole matrix's norms."""
    w = local(p)
    w.sub_(local(direction) * (lr * radius / direction_norm.clamp(min=HYPERBALL_EPS)))
    w.mul_(radius / frobenius(p).clamp(min=HYPERBALL_EPS))


class MuonH(Muon):
    """Muon's direction on the Hyperball: O = NS_k(U) as Muon's, then

        W <- R Norm(W - lr R O / ||O||_F)

    No weight decay (on the sphere it would only scale the step by 1 / (1 - lr wd)) and no shape
    factor (the step is an angle of about lr for every matrix)."""

    def __init__(self, params: Any, lr: float, momentum: float, nesterov: bool, ns_steps: int, radius: float,
                 ns_dtype: torch.dtype | None = None):
        super().__init__(params, lr=lr, weight_decay=0.0, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                         shape_rule="none", ns_dtype=ns_dtype, radius=radius)

    def move(self, p: torch.Tensor, ortho: torch.Tensor, group: dict[str, Any]) -> None:
        radius = hyperball_radius(self.state[p], p, group["radius"])
        hyperball_step(p, like_param(ortho, p), frobenius(ortho), radius, group["lr"])


class AdamH(torch.optim.Optimizer):
    """Adam's direction on the Hyperball (bias-corrected moments, as torch's Adam):

        m <- b1 m + (1 - b1) G,   v <- b2 v + (1 - b2) G^2,   t <- t + 1
        U  = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
        W <- R Norm(W - lr R U / ||U||_F)

    The rate multiplies a unit-norm direction, so Adam's bias correction acts on U's shape only."""

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float, radius: float):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, radius=radius))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        assert closure is None, "AdamH takes no closure"
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                radius = hyperball_radius(state, p, group["radius"])
                state["step"] += 1
                t = state["step"].item()
                m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad  # DTensors under FSDP2, laid out as p
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                u = (m / (1 - beta1**t)) / (v / (1 - beta2**t)).sqrt().add_(group["eps"])
                hyperball_step(p, u, frobenius(u), radius, group["lr"])


def _positive(x: float) -> bool:
    return x > 0 and math.isfinite(x)


def hidden_split(named: list[tuple[str, nn.Parameter]]) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(the hidden 2-D matrices, mup.param_kind 'hidden': what Muon and Hyperball move; the rest: AdamW's)."""
    hidden = [(n, p) for n, p in named if p.dim() == 2 and param_kind(n, p) == "hidden"]
    ids = {id(p) for _, p in hidden}
    return hidden, [(n, p) for n, p in named if id(p) not in ids]


def hidden_peak(model: nn.Module, peak: float, step: str) -> float:
    """A hidden group's peak rate: the optimizer's own (muon_lr, hyperball_lr) times μP's factor
    for the step that moves it."""
    ratio = model.config.mup_ratio
    mup = lr_scale("hidden", ratio, step) if ratio != 1.0 else 1.0
    return peak * mup


def rest_adamw(model: nn.Module, rest: list[tuple[str, nn.Parameter]], settings: OptimizerSettings, device_type: str) -> torch.optim.AdamW:
    """AdamW over the parameters the matrix optimizer does not own, with the paper's groups."""
    return make_adamw(adamw_groups(model, rest, settings.weight_decay, settings.learning_rate), settings, device_type)


def ns_dtype_for(device_type: str) -> torch.dtype | None:
    return torch.bfloat16 if device_type == "cuda" else None  # bf16 matmuls on CUDA; the weights' dtype elsewhere


# The keys Muon and MuonH share (one declaration each, so --muon_momentum means the same in both).
MUON_MOMENTUM = MethodParam("muon_momentum", 0.95, "Muon's (and MuonH's) momentum mu (an EMA of the gradients)",
                            check=lambda m: 0 <= m < 1, must="in [0, 1)")
MUON_NESTEROV = MethodParam("muon_nesterov", True, "Muon's (and MuonH's) Nesterov momentum (else the plain EMA)")
MUON_NS_STEPS = MethodParam("muon_ns_steps", 5, "Newton-Schulz iterations of Muon's (and MuonH's) orthogonalisation",
                            check=lambda k: 1 <= k <= 50, must="an integer from 1 to 50")
HYPERBALL_LR = MethodParam("hyperball_lr", 0.02,
                           "the Hyperball optimizers' peak step of a covered matrix, in radians of its Frobenius sphere "
                           "(the schedule scales it as learning_rate)", check=lambda x: _positive(x) and x <= 1, must="in (0, 1]")
HYPERBALL_RADIUS = MethodParam("hyperball_radius", 0.0,
                               "the Frobenius radius of each covered matrix: 0 keeps its initial norm; r > 0 sets r sqrt(fan_out) "
                               "(entries of std r / sqrt(fan_in))", check=lambda r: r >= 0 and math.isfinite(r), must=">= 0 and finite")


@register_optimizer("muon")
class MuonAdamW(OptimizerRecipe):
    """Muon for the hidden 2-D matrices (attention and MLP weights), AdamW for the rest."""

    title = "Muon"
    rate_key = "muon_lr"
    mup_step = "spectral"
    params = (
        MethodParam("muon_lr", 0.02, "Muon's peak learning rate of the hidden matrices (the schedule scales it as learning_rate)",
                    check=_positive, must="> 0 and finite"),
        MUON_MOMENTUM,
        MUON_NESTEROV,
        MUON_NS_STEPS,
        MethodParam("muon_shape_scale", "original",
                    f"the factor on Muon's rate by a matrix's shape: {', '.join(MUON_SHAPE_SCALES)} (docs/OPTIMIZERS.md)",
                    check=lambda s: s in MUON_SHAPE_SCALES, must=f"one of: {', '.join(MUON_SHAPE_SCALES)}"),
    )

    @classmethod
    def hidden_step(cls, params: dict[str, Any]) -> str | None:
        # Moonlight's factor grows as sqrt(width); Jordan's and none are width-free (docs/MUP.md).
        return "spectral_rms" if params.get("muon_shape_scale") == "match_rms_adamw" else "spectral"

    @classmethod
    def build(cls, model: nn.Module, settings: OptimizerSettings, device_type: str) -> Optimizers:
        keys = settings.optimizer_params
        hidden, rest = hidden_split(trainable(model))
        connection = CONNECTIONS[model.config.connection]
        peak = hidden_peak(model, keys["muon_lr"], cls.hidden_step(keys))
        by_decay: dict[bool, list[nn.Parameter]] = {True: [], False: []}  # the connection's rule decides, as for AdamW
        for n, p in hidden:
            by_decay[connection.optimizer_rule(n, p).decay].append(p)
        groups = [
            {"params": ps, "weight_decay": settings.weight_decay if decays else 0.0, "lr": peak}
            for decays, ps in by_decay.items() if ps
        ]
        muon = Muon(groups, lr=keys["muon_lr"], weight_decay=settings.weight_decay, momentum=keys["muon_momentum"],
                    nesterov=keys["muon_nesterov"], ns_steps=keys["muon_ns_steps"], shape_rule=keys["muon_shape_scale"],
                    ns_dtype=ns_dtype_for(device_type))
        return Optimizers([muon, rest_adamw(model, rest, settings, device_type)])


class Hyperball(OptimizerRecipe):
    """The Hyperball entries' shared part: the hidden matrices on their spheres (no weight decay:
    docs/OPTIMIZERS.md), AdamW with the paper's groups for the rest."""

    rate_key = "hyperball_lr"
    resume_fixed = ("hyperball_radius",)  # each matrix's radius is fixed in the state at its first step

    @classmethod
    def check(cls, model_config: Any, settings: OptimizerSettings) -> None:
        super().check(model_config, settings)
        connection = CONNECTIONS[model_config.connection]
        # A connection that renormalises the matrices itself (nGPT, by rows) would undo the radius every step.
        if connection.after_optimizer_step.__func__ is not Connection.after_optimizer_step.__func__:
            raise ValueError(
                f"connection {model_config.connection!r} renormalises its matrices after every step, which undoes "
                f"{cls.title}'s fixed Frobenius radius; use optimizer=adamw or muon with it, or another connection."
            )

    @classmethod
    def matrix_optimizer(cls, groups: list[dict[str, Any]], settings: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
        raise NotImplementedError

    @classmethod
    def build(cls, model: nn.Module, settings: OptimizerSettings, device_type: str) -> Optimizers:
        keys = settings.optimizer_params
        hidden, rest = hidden_split(trainable(model))
        if keys["hyperball_radius"] == 0:
            zero = next((n for n, p in hidden if frobenius(p).item() == 0), None)
            if zero is not None:  # its initial norm, 0, would keep it at 0 for ever
                raise ValueError(f"{zero} starts at norm 0, so hyperball_radius=0 (each matrix's initial norm) would hold it there; set hyperball_radius > 0.")
        groups = [{"params": [p for _, p in hidden], "weight_decay": 0.0, "lr": hidden_peak(model, keys["hyperball_lr"], cls.mup_step)}]
        return Optimizers([cls.matrix_optimizer(groups, settings, device_type), rest_adamw(model, rest, settings, device_type)])


@register_optimizer("adamh")
class AdamHAdamW(Hyperball):
    """AdamH for the hidden 2-D matrices (Adam's direction, beta1 and beta2 as AdamW's), AdamW for the rest."""

    title = "AdamH"
    mup_step = "hyperball_adam"
    params = (HYPERBALL_LR, HYPERBALL_RADIUS)

    @classmethod
    def matrix_optimizer(cls, groups: list[dict[str, Any]], settings: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
        keys = settings.optimizer_params
        return AdamH(groups, lr=keys["hyperball_lr"], betas=(settings.beta1, settings.beta2), eps=ADAM_EPS, radius=keys["hyperball_radius"])


@register_optimizer("muonh")
class MuonHAdamW(Hyperball):
    """MuonH for the hidden 2-D matrices (Muon's momentum and Newton-Schulz), AdamW for the rest."""

    title = "MuonH"
    mup_step = "hyperball_spectral"
    params = (HYPERBALL_LR, HYPERBALL_RADIUS, MUON_MOMENTUM, MUON_NESTEROV, MUON_NS_STEPS)

    @classmethod
    def matrix_optimizer(cls, groups: list[dict[str, Any]], settings: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
        keys = settings.optimizer_params
        return MuonH(groups, lr=keys["hyperball_lr"], momentum=keys["muon_momentum"], nesterov=keys["muon_nesterov"],
                     ns_steps=keys["muon_ns_steps"], radius=keys["hyperball_radius"], ns_dtype=ns_dtype_for(device_type))
