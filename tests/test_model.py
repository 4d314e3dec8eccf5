"""Tests of model.py: the connections' maths against independent formulas, and the GPT."""

import math

import pytest
import torch

from spheretnorm.optim import build_optimizer
from spheretnorm.runtime.device import estimate_mfu
from spheretnorm.runtime.config import TrainConfig
from spheretnorm.diagnostics import residual_stream_report
from spheretnorm.model import CONNECTIONS, GPT, SPHERE_CONNECTIONS, GPTConfig, ScaleNorm, SphereConnection
from spheretnorm.runtime.checkpoint import checkpoint_state, clean_state_dict
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model

# Tiny tensors: one thread each is many times faster on a shared two-core machine (conftest.one_thread),
# which keeps README's install check quick where other work holds the cores.
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=96)


def tiny_config(**overrides) -> GPTConfig:
    return GPTConfig(**{**TINY, **overrides})


def sphere_point(shape, generator, radius=None) -> torch.Tensor:
    """Random points on the sphere of radius sqrt(d) (or `radius`)."""
    h = torch.randn(*shape, generator=generator, dtype=torch.float64).float()
    d = shape[-1]
    return h / h.norm(dim=-1, keepdim=True) * (math.sqrt(d) if radius is None else radius)


def connection(name: str, layer_idx: int = 1, **cfg) -> torch.nn.Module:
    config = GPTConfig(**{**TINY, "n_layer": max(layer_idx, 2), "connection": name, **cfg})
    return CONNECTIONS[name](config, layer_idx)


# -----------------------------------------------------------------------------
# Reference retractions, written from the paper's equations with explicit matrices
# (independent of model.py's closed forms).


def tangent(h: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt: the part of f orthogonal to h (Eq. 5)."""
    return f - (h @ f) / (h @ h) * h


def generator_matrix(h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Skew-symmetric W with W h/||h|| = z/||z|| and W z/||z|| = -h/||h||: unit-speed rotation."""
    hu, zu = h / h.norm(), z / z.norm()
    return torch.outer(zu, hu) - torch.outer(hu, zu)


def ref_exp(h, f, alpha, angle_max=None):
    """GeoNorm (Eq. 6): exp of the skew matrix, angle beta = alpha ||z|| / ||h||."""
    z = tangent(h, f)
    theta = alpha * z.norm() / h.norm()
    if angle_max is not None:
        theta = min(theta, angle_max)
    return torch.linalg.matrix_exp(theta * generator_matrix(h, z)) @ h


def ref_proj(h, f, alpha):
    """Proj-SpheretNorm (Eq. 9): metric projection of h + alpha z back to the sphere."""
    z = tangent(h, f)
    v = h + alpha * z
    return h.norm() * v / v.norm()


def ref_cayley(h, f, alpha, angle_max):
    """Cay-SpheretNorm (Eq. 10): (I - W/2)^-1 (I + W/2) h with W = b * unit rotation,

    b = min(beta, 2 tan(angle_max / 2)) so that the angle 2 arctan(b/2) <= angle_max.
    """
    z = tangent(h, f)
    b = min(alpha * z.norm() / h.norm(), 2 * math.tan(angle_max / 2))
    W = b * generator_matrix(h, z)
    eye = torch.eye(h.numel(), dtype=h.dtype)
    return torch.linalg.solve(eye - W / 2, (eye + W / 2) @ h)


def apply_rowwise(fn, H, Fh, *args):
    return torch.stack([fn(h, f, *args) for h, f in zip(H, Fh)])


def random_case(seed=0, n=24, d=16, spread=(0.05, 3.0)):
    """Points on the sphere and sublayer outputs whose tangent size spans small to large angles."""
    g = torch.Generator().manual_seed(seed)
    H = sphere_point((n, d), g).double()
    Fh = torch.randn(n, d, generator=g, dtype=torch.float64)
    scale = torch.linspace(spread[0], spread[1], n, dtype=torch.float64).unsqueeze(-1)
    Fh = Fh / Fh.norm(dim=-1, keepdim=True) * scale * H.norm(dim=-1, keepdim=True)
    return H, Fh


def run_conn(conn, H, Fh):
    """Call a connection with a sublayer that returns the fixed outputs Fh."""
    out = conn(H.float(), lambda x: Fh.float())
    return out.double()


# -----------------------------------------------------------------------------
# The sphere retractions against the references


@pytest.mark.parametrize(
    "name, layer_idx, ref",
    [
        ("geonorm", 1, lambda H, Fh, a, am: apply_rowwise(ref_exp, H, Fh, a, am)),
        ("geonorm", 4, lambda H, Fh, a, am: apply_rowwise(ref_exp, H, Fh, a, am)),
        ("proj_spheret", 1, lambda H, Fh, a, am: apply_rowwise(ref_proj, H, Fh, a)),
        ("proj_spheret", 9, lambda H, Fh, a, am: apply_rowwise(ref_proj, H, Fh, a)),
        ("cay_spheret", 1, lambda H, Fh, a, am: apply_rowwise(ref_cayley, H, Fh, a, am)),
        ("cay_spheret", 4, lambda H, Fh, a, am: apply_rowwise(ref_cayley, H, Fh, a, am)),
    ],
)
def test_sphere_connection_matches_reference(name, layer_idx, ref):
    H, Fh = random_case(seed=layer_idx)
    conn = connection(name, layer_idx)
    alpha = 1.0 / math.sqrt(layer_idx)  # softplus(a) = 1 at init, sqrt decay
    expected = ref(H, Fh, alpha, math.pi / 4)
    torch.testing.assert_close(run_conn(conn, H, Fh), expected, rtol=1e-5, atol=1e-5)


def test_p_spheret_family_limits():
    H, Fh = random_case(seed=3)
    out = lambda p, **kw: run_conn(connection("p_spheret", spheret_p=p, **kw), H, Fh)
    # p = 1 is the metric projection, p = 2 the (capped) Cayley map.
    torch.testing.assert_close(out(1.0), apply_rowwise(ref_proj, H, Fh, 1.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        out(2.0), apply_rowwise(ref_cayley, H, Fh, 1.0, math.pi / 4), rtol=1e-5, atol=1e-5
    )
    # p -> infinity: the exponential map without a cap (angle_max = pi never binds here).
    Hs, Fs = random_case(seed=4, spread=(0.05, 1.5))
    big = run_conn(connection("p_spheret", spheret_p=1e4, angle_max=math.pi), Hs, Fs)
    torch.testing.assert_close(big, apply_rowwise(ref_exp, Hs, Fs, 1.0), rtol=1e-4, atol=1e-4)
    # p -> 0: the identity.
    torch.testing.assert_close(out(1e-4), H, rtol=0, atol=1e-3 * math.sqrt(H.size(-1)))


def test_p_spheret_equals_named_retractions_exactly():
    """The family's p=1 and p=2 members agree with the dedicated classes (same angle_max)."""
    H, Fh = random_case(seed=5)
    for p, name in ((1.0, "proj_spheret"), (2.0, "cay_spheret")):
        for angle_max in (math.pi / 4, math.pi / 2):
            a = run_conn(connection("p_spheret", spheret_p=p, angle_max=angle_max), H, Fh)
            b = run_conn(connection(name, angle_max=angle_max), H, Fh)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SPHERE_CONNECTIONS)
def test_rotation_angle_never_exceeds_cap(name):
    H, Fh = random_case(seed=6, spread=(1.0, 50.0))
    out = run_conn(connection(name, spheret_p=3.0), H, Fh)
    cos = (out * H).sum(-1) / (out.norm(dim=-1) * H.norm(dim=-1))
    angles = torch.acos(cos.clamp(-1, 1))
    if name == "proj_spheret":  # theta = arctan(beta) < pi/2 needs no cap
        assert math.pi / 4 < angles.max().item() < math.pi / 2
    else:
        assert angles.max().item() <= math.pi / 4 + 1e-4


# -----------------------------------------------------------------------------
# Norm preservation


def drift_after_updates(name: str, n_layer: int, dtype_mode: str) -> float:
    """Relative change of ||h|| after 2 * n_layer successive updates by one connection type."""
    g = torch.Generator().manual_seed(0)
    config = GPTConfig(n_layer=n_layer, n_head=2, n_embd=64, connection=name)
    d = config.n_embd
    W = torch.randn(d, d, generator=g) / math.sqrt(d)
    sublayer = lambda x: torch.tanh(x @ W) * 3.0  # a nonlinear F with sizeable tangent part
    h0 = sphere_point((4, 8, d), g)
    h = h0.clone()
    if dtype_mode == "bf16":
        h = h.bfloat16()
        W = W.bfloat16()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if dtype_mode == "autocast" else torch.no_grad()
    with ctx, torch.no_grad():
        for layer_idx in range(1, n_layer + 1):
            for slot in (0, 1):
                h = CONNECTIONS[name](config, layer_idx, slot)(h, sublayer)
    ratio = h.float().norm(dim=-1) / h0.norm(dim=-1)
    return (ratio - 1).abs().max().item()


@pytest.mark.parametrize("name", SPHERE_CONNECTIONS)
def test_norm_preserved_fp32_over_72_updates(name):
    assert drift_after_updates(name, n_layer=36, dtype_mode="fp32") < 1e-5


@pytest.mark.parametrize("name", SPHERE_CONNECTIONS)
def test_norm_bounded_under_bf16(name):
    # Under autocast the retraction runs in fp32, so the drift stays at fp32 level.
    assert drift_after_updates(name, n_layer=36, dtype_mode="autocast") < 1e-5
    # With the residual stream itself stored in bf16 each update rounds h to 8 bits of
    # mantissa; the drift is then a random walk of bf16 rounding errors, still bounded.
    assert drift_after_updates(name, n_layer=36, dtype_mode="bf16") < 3e-2


# -----------------------------------------------------------------------------
# Degenerate sublayer outputs


@pytest.mark.parametrize("name", SPHERE_CONNECTIONS)
@pytest.mark.parametrize("case", ["parallel", "zero"])
def test_degenerate_update_is_identity_and_finite(name, case):
    g = torch.Generator().manual_seed(1)
    h = sphere_point((3, 5, 16), g).requires_grad_(True)
    conn = connection(name)
    if case == "parallel":
        sublayer = lambda x: 2.5 * x  # F(h) parallel to h: z = 0
    else:
        sublayer = lambda x: torch.zeros_like(x) * x
    out = conn(h, sublayer)
    torch.testing.assert_close(out, h, rtol=1e-6, atol=1e-6)
    out.square().sum().backward()
    assert torch.isfinite(h.grad).all()
    assert torch.isfinite(conn.a.grad).all()


# -----------------------------------------------------------------------------
# Initialisation of the learnable scalars


@pytest.mark.parametrize("name", SPHERE_CONNECTIONS)
def test_step_size_at_init(name):
    config = GPTConfig(n_layer=9, n_head=2, n_embd=32, connection=name)
    for l in range(1, 10):
        conn = CONNECTIONS[name](config, l)
        assert torch.nn.functional.softplus(conn.a).item() == pytest.approx(1.0, abs=1e-6)
        assert conn.step_size().item() == pytest.approx(1.0 / math.sqrt(l), rel=1e-6)


@pytest.mark.parametrize(
    "decay, index, expected",
    [
        ("harmonic", "block", lambda l, s, L: 1.0 / l),
        ("linear", "block", lambda l, s, L: (L - l) / L),
        ("none", "block", lambda l, s, L: 1.0),
        ("sqrt", "sublayer", lambda l, s, L: 1.0 / math.sqrt(2 * l - 1 + s)),
        ("linear", "sublayer", lambda l, s, L: (2 * L - (2 * l - 1 + s)) / (2 * L)),
    ],
)
def test_alpha_decay_options(decay, index, expected):
    L = 6
    config = GPTConfig(n_layer=L, n_head=2, n_embd=32, connection="geonorm",
                       alpha_decay=decay, alpha_index=index)
    for l in range(1, L + 1):
        for slot in (0, 1):
            got = CONNECTIONS["geonorm"](config, l, slot).step_size().item()
            assert got == pytest.approx(expected(l, slot, L), abs=1e-7)


@pytest.mark.parametrize("d", [64, 768])  # sqrt(d) = 8 < 20 and 27.7 >= 20: both init branches
def test_embedding_scalenorm_radius(d):
    norm = ScaleNorm(d)
    assert norm.radius().item() == pytest.approx(math.sqrt(d), rel=1e-6)
    x = torch.randn(5, d) * 7.0
    torch.testing.assert_close(norm(x).norm(dim=-1), torch.full((5,), math.sqrt(d)))


@pytest.mark.parametrize("name", SPHERE_CONNECTIONS)
def test_sphere_model_hidden_rms_is_one(name):
    """Every hidden state of a sphere model has norm sqrt(d), i.e. RMS 1, at init."""
    torch.manual_seed(0)
    model = GPT(tiny_config(connection=name))
    diag = residual_stream_report(model, torch.randint(0, 96, (2, 16)))
    assert diag["rms"] == pytest.approx([1.0] * 3, abs=1e-5)
    assert len(diag["angle"]) == 4
    assert all(0 < a <= math.pi / 4 + 1e-5 for a in diag["angle"])


def test_diagnostics_detects_collapse():
    torch.manual_seed(0)
    model = GPT(tiny_config(connection="pre_ln"))
    idx = torch.randint(0, 96, (2, 16))
    assert residual_stream_report(model, idx)["final_cosine"] < 0.9
    # Make every token's final state the same vector: ln_f with zero gain and a fixed bias.
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(0.3)
    assert residual_stream_report(model, idx)["final_cosine"] == pytest.approx(1.0, abs=1e-5)


# -----------------------------------------------------------------------------
# The whole model


@pytest.mark.parametrize("name", list(CONNECTIONS))
def test_every_connection_trains(name):
    torch.manual_seed(0)
    model = GPT(tiny_config(connection=name))
    x = torch.randint(0, 96, (8, 16), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=1e-2, min_lr=0.0, beta1=0.9, beta2=0.95), "cpu")
    _, first = model(x, y)
    for _ in range(30):
        _, loss = model(x, y)
        assert torch.isfinite(loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _, last = model(x, y)
    # DyT learns slowest at this size (4.56 -> 3.06); the others reach ~0.1-1.7.
    assert last.item() < 0.75 * first.item(), (first.item(), last.item())


@pytest.mark.parametrize("name", list(CONNECTIONS))
def test_forward_backward_finite_and_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    model = GPT(tiny_config(connection=name))
    x = torch.randint(0, 96, (2, 16))
    logits, loss = model(x, x)
    assert logits.shape == (2, 16, 96)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


SCALES = {"S": (12, 12, 768, 0.12), "M": (24, 16, 1024, 0.35), "L": (36, 20, 1280, 0.77)}


@pytest.mark.parametrize("scale", list(SCALES))
def test_paper_parameter_counts(scale):
    n_layer, n_head, n_embd, billions = SCALES[scale]
    counts = {}
    for name in CONNECTIONS:
        with torch.device("meta"):  # no memory, no init cost
            model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, connection=name))
        counts[name] = model.get_num_params(non_embedding=False)
    assert abs(counts["pre_ln"] / 1e9 - billions) < 0.01
    tied = {name: n for name, n in counts.items() if CONNECTIONS[name].tie_embeddings}
    lo, hi = min(tied.values()), max(tied.values())
    assert (hi - lo) / lo < 1e-3, counts
    # An untied LM head (nGPT's) adds its own vocab x d matrix and nothing else of note.
    head = GPTConfig().vocab_size * n_embd
    for name in set(counts) - set(tied):
        assert abs(counts[name] - head - counts["pre_ln"]) / counts["pre_ln"] < 1e-3, (name, counts[name])


def test_pre_ln_matches_huggingface_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = dict(n_layer=3, n_head=4, n_embd=32, block_size=24, vocab_size=101)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=3, n_head=4, n_embd=32, n_positions=24, vocab_size=101,
            activation_function="gelu",  # exact GELU, as nn.GELU() (GPT-2 ships gelu_new)
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
        )
    ).eval()
    # Give biases and norms random values so a mis-mapped one cannot hide.
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "ln_" in n or n.endswith("bias"):
                p.normal_(0.0 if n.endswith("bias") else 1.0, 0.1)
    ours = GPT(GPTConfig(**cfg, connection="pre_ln", bias=True)).eval()
    sd = hf.state_dict()
    mapped = {}
    for k, v in ours.state_dict().items():
        hk = (k.replace(".conn_attn.ln.", ".ln_1.").replace(".conn_mlp.ln.", ".ln_2."))
        if k == "lm_head.weight":
            hk = "transformer.wte.weight"
        w = sd[hk]
        if hk.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            w = w.t()  # HF's Conv1D stores (in, out)
        mapped[k] = w
    ours.load_state_dict(mapped)
    idx = torch.randint(0, 101, (3, 24))
    with torch.no_grad():
        expected = hf(idx).logits
        got, _ = ours(idx)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# -----------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(connection="resnet"), r"Unknown connection 'resnet'; valid connections are: pre_ln"),
        (dict(spheret_p=0.0), r"spheret_p must be > 0, got 0.0"),
        (dict(spheret_p=-1.0), r"spheret_p must be > 0"),
        (dict(angle_max=0.0), r"angle_max must lie in \(0, pi\], got 0.0"),
        (dict(angle_max=3.5), r"angle_max must lie in \(0, pi\], got 3.5"),
        (dict(n_embd=30, n_head=4), r"n_embd=30 is not divisible by n_head=4"),
        (dict(alpha_decay="cosine"), r"Unknown alpha_decay 'cosine'; valid values are: sqrt, harmonic"),
        (dict(alpha_index="token"), r"Unknown alpha_index 'token'"),
        (dict(keel_alpha=0.0), r"keel_alpha must be > 0"),
    ],
)
def test_bad_config_raises_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**kwargs)


def test_angle_max_pi_is_allowed():
    assert tiny_config(angle_max=math.pi).angle_max == math.pi


def test_sequence_longer_than_block_size_is_refused():
    model = GPT(tiny_config())
    with pytest.raises(ValueError, match="length 17; block_size is 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


# -----------------------------------------------------------------------------
# The rest of nanoGPT's model


def test_weight_tying_and_init_scales():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=8, n_head=4, n_embd=256, vocab_size=512, block_size=64))
    assert model.lm_head.weight is model.transformer.wte.weight
    c_fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.transformer.h])
    c_proj = torch.cat([b.mlp.c_proj.weight.flatten() for b in model.transformer.h])
    assert c_fc.std().item() == pytest.approx(0.02, rel=0.02)
    assert c_proj.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.02)
    assert all((b.attn.c_attn.bias == 0).all() for b in model.transformer.h)


@pytest.mark.parametrize("name", list(CONNECTIONS))
def test_optimizer_groups(name):
    model = GPT(tiny_config(connection=name))
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1, learning_rate=1e-3, min_lr=0.0, beta1=0.9, beta2=0.95), "cpu")
    if name == "ngpt":  # its matrices live on the unit sphere: nothing is decayed
        assert [g["weight_decay"] for g in opt.param_groups] == [0.0]
        assert len(opt.param_groups[0]["params"]) == len(list(model.parameters()))
        return
    # By value, not by order: a connection's own optimizer_rule may put the first parameter in either.
    decay, no_decay = sorted(opt.param_groups, key=lambda g: -g["weight_decay"])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # each exactly once
    assert all(p.dim() >= 2 for p in decay["params"])
    scalars = [p for n, p in model.named_parameters() if n.endswith((".a", ".gamma", ".alpha"))]
    no_decay_ids = {id(p) for p in no_decay["params"]}
    assert all(id(p) in no_decay_ids for p in scalars)
    if name in SPHERE_CONNECTIONS or name == "pre_dyt":
        assert scalars


def test_estimate_mfu_follows_the_palm_formula():
    model = GPT(tiny_config())
    N = sum(p.numel() for p in model.parameters()) - 16 * 32  # without position embeddings
    flops = (6 * N + 12 * 2 * 2 * 16 * 16) * 16 * 4  # per token * T * 4 sequences
    assert estimate_mfu(model, 4, 0.5, peak_flops=1e9) == pytest.approx(flops / 0.5 / 1e9)


def test_generate_greedy_is_deterministic_and_uses_the_block():
    torch.manual_seed(0)
    model = GPT(tiny_config(connection="cay_spheret")).eval()
    prompt = torch.randint(0, 96, (2, 5))
    a = model.generate(prompt, 20, temperature=0)
    b = model.generate(prompt, 20, temperature=0)
    assert a.shape == (2, 25) and torch.equal(a, b) and torch.equal(a[:, :5], prompt)
    # Greedy: each new token is the argmax of the full-sequence logits at its position.
    logits, _ = model(a[:, -16:])
    assert torch.equal(logits[:, -2].argmax(-1), a[:, -1])
    sampled = model.generate(prompt, 8, temperature=0.8, top_k=5)
    assert sampled.shape == (2, 13)


@pytest.mark.parametrize("name", ["pre_ln", "geonorm", "p_spheret"])
def test_checkpoint_round_trip(tmp_path, name):
    torch.manual_seed(0)
    model = GPT(tiny_config(connection=name, spheret_p=0.7)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # not the init values
    path = tmp_path / "ckpt.pt"
    state = checkpoint_state(model)
    # A compiled, DDP-wrapped model saves prefixed names; loading must strip them.
    state["model"] = {"module._orig_mod." + k: v for k, v in state["model"].items()}
    torch.save(state, path)
    loaded = load_model(path).eval()
    assert loaded.config == model.config
    x = torch.randint(0, 96, (2, 16))
    torch.testing.assert_close(loaded(x)[0], model(x)[0], rtol=0, atol=0)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"model": {}, "model_args": {}}, tmp_path / "nanogpt.pt")
    with pytest.raises(ValueError, match="not a spheretnorm checkpoint"):
        load_checkpoint(tmp_path / "nanogpt.pt")


def test_clean_state_dict():
    assert list(clean_state_dict({"_orig_mod.module.a.b": 1, "c": 2})) == ["a.b", "c"]


def test_sphere_connections_are_the_sphere_classes():
    """SPHERE_CONNECTIONS is read off the registry, and every retraction of the table has a user."""
    from spheretnorm.retractions import RETRACTIONS

    assert set(SPHERE_CONNECTIONS) == {n for n, cls in CONNECTIONS.items() if issubclass(cls, SphereConnection)}
    assert {CONNECTIONS[n].retraction for n in SPHERE_CONNECTIONS} == set(RETRACTIONS)
