"""A connection's parameters are declared one way (MethodParam in its class's params), and the
move of spheret_p, dyt_alpha, keel_alpha and peri_embed_ln from GPTConfig fields into
connection_params changes nothing a user sees.

What commit 3ab3f93 wrote (every checkpoint and run folder: all four keys at the top level, for
every connection) reads into today's form and builds the same model; method keys, run folders,
W&B names, table rows and --help are as they were (only spheret_p is in the method key: in_key);
the old checks are the same one-sentence errors, with any connection.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from spheretnorm.experiments import grid
from spheretnorm.model import CONNECTIONS, GPT, MODEL_FIELDS, Connection, GPTConfig, MethodParam, register_connection
from spheretnorm.runtime import methods
from spheretnorm.runtime.checkpoint import read_torch_file
from spheretnorm.runtime.checkpoint import load_model
from spheretnorm.runtime.config import (
    ConfigError,
    config_from_dict,
    config_help,
    model_key_conflicts,
    model_keys_of,
    parse_config,
    TrainConfig,
)
from spheretnorm.runtime.identity import config_conflicts, method_keys_neutral
from spheretnorm.runtime.methods import default_out_dir, method_key

pytestmark = pytest.mark.usefixtures("one_thread")

# The connections of commit 3ab3f93, and the one each of the four keys belonged to.
LEGACY_CONNECTIONS = ("pre_ln", "post_ln", "pre_dyt", "peri_ln", "keel", "lns", "geonorm", "proj_spheret", "cay_spheret", "p_spheret", "ngpt")
OWNER = {"spheret_p": "p_spheret", "dyt_alpha": "pre_dyt", "keel_alpha": "keel", "peri_embed_ln": "peri_ln"}
DEFAULTS = {"spheret_p": 0.5, "dyt_alpha": 0.5, "keel_alpha": None, "peri_embed_ln": False}
CHANGED = {"spheret_p": 0.7, "dyt_alpha": 0.3, "keel_alpha": 3.0, "peri_embed_ln": True}
TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32)
LEGACY_DIR = Path(__file__).resolve().parent / "data" / "legacy_3ab3f93"


def legacy_dict(connection: str, block: str = "gpt2", **values) -> dict:
    """A model_config as 3ab3f93's asdict(GPTConfig) wrote it: the four keys at the top level."""
    return {**TINY, "dropout": 0.0, "bias": None, "connection": connection, "block": block,
            "spheret_p": 0.5, "angle_max": 0.7853981633974483, "alpha_decay": "sqrt", "alpha_index": "block",
            "dyt_alpha": 0.5, "keel_alpha": None, "peri_embed_ln": False, "mup_base_width": 0, "sphere_impl": "reference",
            "connection_params": {}, **values}  # fmt: skip


def own_params(connection: str, values: dict) -> dict:
    return {k: v for k, v in values.items() if OWNER[k] == connection}


# -----------------------------------------------------------------------------
# Configs written before: into today's form, the same model


@pytest.mark.parametrize("values", [DEFAULTS, CHANGED], ids=["defaults", "changed"])
@pytest.mark.parametrize("block", ["gpt2", "llama"])
@pytest.mark.parametrize("connection", LEGACY_CONNECTIONS)
def test_a_legacy_model_config_reads_into_connection_params(connection: str, block: str, values: dict) -> None:
    old = legacy_dict(connection, block, **values)
    cfg = config_from_dict(old)
    assert cfg.connection_params == own_params(connection, values)
    saved = asdict(cfg)  # what a checkpoint written today holds
    assert not set(OWNER) & set(saved) and saved["connection_params"] == own_params(connection, values)
    # An exported folder's config.json: other keys beside, read through model_keys_of.
    folder = {"architectures": ["SpheretNormForCausalLM"], "model_type": "spheretnorm", "logit_multiplier": 1.0, **old}
    assert asdict(config_from_dict(model_keys_of(folder))) == saved
    # Written today, it reads back as it is.
    assert asdict(config_from_dict(saved)) == saved
    # A checkpoint from before connection_params existed (tests/data/ckpt_v1) has no such key.
    assert asdict(config_from_dict({k: v for k, v in old.items() if k != "connection_params"})) == saved


@pytest.mark.parametrize("block", ["gpt2", "llama"])
@pytest.mark.parametrize("connection", LEGACY_CONNECTIONS)
def test_a_legacy_model_config_builds_the_same_model(connection: str, block: str) -> None:
    new_form = {k: v for k, v in legacy_dict(connection, block).items() if k not in OWNER}
    new_form["connection_params"] = own_params(connection, CHANGED)
    torch.manual_seed(0)
    old = GPT(config_from_dict(legacy_dict(connection, block, **CHANGED))).eval()
    torch.manual_seed(0)
    new = GPT(GPTConfig(**new_form)).eval()
    old_state, new_state = old.state_dict(), new.state_dict()
    assert list(old_state) == list(new_state)
    for name in new_state:  # the same init, dyt_alpha's included
        torch.testing.assert_close(old_state[name], new_state[name], rtol=0, atol=0, msg=name)
    with torch.no_grad():
        for p in new.parameters():  # weights unlike the init, so that keel_alpha's scale shows
            p.add_(0.1 * torch.randn_like(p))
    old.load_state_dict(new.state_dict())
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(old(idx)[0], new(idx)[0], rtol=0, atol=0)


def test_the_changed_values_make_a_difference() -> None:
    """So that the test above fails where a legacy key is lost: each owner's value changes the model."""
    idx = torch.randint(0, TINY["vocab_size"], (1, TINY["block_size"]), generator=torch.Generator().manual_seed(1))
    for key, connection in OWNER.items():
        out = []
        for values in (DEFAULTS, CHANGED):
            torch.manual_seed(0)
            model = GPT(config_from_dict(legacy_dict(connection, **values))).eval()
            with torch.no_grad():
                for p in model.parameters():  # as above: weights unlike the init
                    p.add_(0.1 * torch.randn_like(p))
                out.append(model(idx)[0])
        assert (out[0] - out[1]).abs().max() > 1e-3, key


def legacy_checkpoints() -> list[Path]:
    return sorted(LEGACY_DIR.glob("*.pt")) if LEGACY_DIR.is_dir() else []


@pytest.mark.skipif(not legacy_checkpoints(), reason="tests/data/legacy_3ab3f93 is not here")
def test_every_checkpoint_of_3ab3f93_loads_in_todays_form() -> None:
    expected = json.loads((LEGACY_DIR / "expected.json").read_text())
    by_file = {pair["checkpoint"]: pair for pair in expected["pairs"].values()}
    for path in legacy_checkpoints():
        if path.name not in by_file:
            continue  # logits.pt
        ckpt = read_torch_file(path)
        old = ckpt["model_config"]
        assert set(OWNER) <= set(old), path.name  # all four at the top level, whatever the connection
        config = load_model(path).config
        assert config.connection_params == own_params(config.connection, {k: old[k] for k in OWNER}), path.name
        # The command that wrote it asks for the same model today: no conflict on resume.
        parsed = parse_config(by_file[path.name]["train_args"], world_size=1)
        assert model_key_conflicts(parsed.model_keys, old) == [], path.name


# -----------------------------------------------------------------------------
# Resumes and reused run folders compare in today's form


def test_resume_conflicts_compare_the_connection_parameters() -> None:
    old = legacy_dict("p_spheret", spheret_p=0.25)
    new = asdict(config_from_dict(old))
    for saved in (old, new):
        assert model_key_conflicts({"connection": "p_spheret", "spheret_p": 0.25}, saved) == []
        assert model_key_conflicts({"spheret_p": 0.3}, saved) == ["spheret_p: checkpoint has 0.25, the config/command line asks for 0.3"]
    # A key the checkpoint's connection does not declare changes nothing: never a conflict.
    assert model_key_conflicts({"keel_alpha": 3.0}, legacy_dict("pre_ln")) == []
    assert model_key_conflicts({"keel_alpha": 3.0}, legacy_dict("keel")) == ["keel_alpha: checkpoint has None, the config/command line asks for 3.0"]


def old_run_config(parsed, **values) -> dict:
    """config.json as 3ab3f93's train.py wrote it for `parsed`: both configs, the four keys at the
    top level (values: those the command line set), connection_params empty."""
    model = {k: v for k, v in asdict(parsed.model_config()).items() if k != "connection_params"}
    return {**asdict(parsed.train), **model, **DEFAULTS, **values, "connection_params": {}, "method": "x"}


@pytest.mark.parametrize(
    "argv",
    [
        ["--connection=pre_ln", "--keel_alpha=3"],
        ["--connection=p_spheret", "--spheret_p=0.25"],
        ["--connection=pre_dyt", "--dyt_alpha=0.3"],
        ["--connection=keel", "--keel_alpha=3"],
        ["--connection=peri_ln", "--peri_embed_ln=true"],
        ["--connection=peri_ln", "--peri_embed_ln=true", "--dyt_alpha=0.3"],
        ["--connection=ngpt", "--spheret_p=2"],
    ],
)
def test_a_run_folder_written_before_does_not_conflict_with_the_same_request(argv: list[str], tmp_path: Path) -> None:
    parsed = parse_config([*argv, "--n_layer=2"], world_size=1)
    values = {k: v for k, v in parsed.model_keys.items() if k in OWNER}
    (tmp_path / grid.CONFIG_NAME).write_text(json.dumps(old_run_config(parsed, **values)))
    assert config_conflicts(tmp_path, parsed) == []
    # And one written today.
    (tmp_path / grid.CONFIG_NAME).write_text(json.dumps({**asdict(parsed.train), **asdict(parsed.model_config()), "method": "x"}))
    assert config_conflicts(tmp_path, parsed) == []


def test_a_run_folder_with_another_p_conflicts(tmp_path: Path) -> None:
    parsed = parse_config(["--connection=p_spheret", "--spheret_p=0.5"], world_size=1)
    (tmp_path / grid.CONFIG_NAME).write_text(json.dumps(old_run_config(parsed, spheret_p=0.25)))
    assert config_conflicts(tmp_path, parsed) == ["spheret_p: the run has 0.25, asked for 0.5"]
    other = parse_config(["--connection=p_spheret", "--spheret_p=0.25"], world_size=1)
    (tmp_path / grid.CONFIG_NAME).write_text(json.dumps({**asdict(other.train), **asdict(other.model_config())}))
    assert config_conflicts(tmp_path, parsed) == ["spheret_p: the run has 0.25, asked for 0.5"]


# -----------------------------------------------------------------------------
# in_key: the method keys, run folders and names of 3ab3f93


# (method key, run folder, table row, train.py arguments) of each connection at its defaults
NAMES = {
    "pre_ln": ("pre_ln", "pre_ln", "Pre-LN", []),
    "post_ln": ("post_ln", "post_ln", "Post-LN", []),
    "pre_dyt": ("pre_dyt", "pre_dyt", "Pre-DyT", []),
    "peri_ln": ("peri_ln", "peri_ln", "Peri-LN", []),
    "keel": ("keel", "keel", "Keel", []),
    "lns": ("lns", "lns", "LNS", []),
    "geonorm": ("geonorm", "geonorm", "GeoNorm", []),
    "proj_spheret": ("proj_spheret", "proj_spheret", "Proj-SpheretNorm (1-SpheretNorm)", []),
    "cay_spheret": ("cay_spheret", "cay_spheret", "Cay-SpheretNorm (2-SpheretNorm)", []),
    "p_spheret": ("p_spheret:0.5", "p_spheret-0.5", "0.5-SpheretNorm", ["--spheret_p=0.5"]),
    "ngpt": ("ngpt", "ngpt", "nGPT", []),
}


@pytest.mark.parametrize("connection", LEGACY_CONNECTIONS)
def test_method_key_and_folder_of_every_connection_are_unchanged(connection: str) -> None:
    key, folder, title, args = NAMES[connection]
    cfg = parse_config([f"--connection={connection}"], world_size=1).model_config()
    assert method_key(cfg) == methods.canonical_method(connection) == key
    assert default_out_dir("cfg", cfg) == f"out/cfg/{folder}"
    assert methods.resolve_wandb_names(TrainConfig(config_name="openwebtext_s"), methods.method_config(key)).wandb_run_name == f"openwebtext_s/{folder}"
    assert methods.display_name(key) == title
    assert methods.method_args(key) == [f"--connection={connection}", *args]
    assert methods.method_form(connection) == ("p_spheret:P" if connection == "p_spheret" else connection)
    if connection != "p_spheret":  # a parameter outside the method key is not written in it
        with pytest.raises(methods.UsageError, match=f"takes the form {connection};"):
            methods.method_model_keys(f"{connection}:0.3")


@pytest.mark.parametrize("override", ["--dyt_alpha=0.3", "--keel_alpha=3", "--peri_embed_ln=true", "--spheret_p=0.3", "--keel_alpha=none"])
@pytest.mark.parametrize("connection", LEGACY_CONNECTIONS)
def test_a_parameter_with_any_connection_names_the_folder_as_before(connection: str, override: str) -> None:
    parsed = parse_config([f"--connection={connection}", override], world_size=1)
    cfg = parsed.model_config(vocab_size=50)
    key, value = override[2:].split("=")
    base = NAMES[connection][1]
    if key == "spheret_p":  # in the method key: no suffix, and p_spheret's folder holds the value
        expected = "p_spheret-0.3" if connection == "p_spheret" else base
    elif value == "none":  # keel_alpha's default
        expected = base
    else:
        expected = f"{base}+{key}={value}"
    assert default_out_dir("x", cfg, parsed.overrides) == f"out/x/{expected}"


def test_only_the_method_key_parameters_are_reserved_for_the_launchers() -> None:
    assert {"connection", "spheret_p"} <= method_keys_neutral()
    assert not {"dyt_alpha", "keel_alpha", "peri_embed_ln"} & method_keys_neutral()
    for arg in ("--dyt_alpha=0.3", "--keel_alpha=3", "--peri_embed_ln=true"):
        assert grid.check_overrides([arg], {}) == [arg]
    with pytest.raises(grid.UsageError, match=r"--spheret_p is set by this script; use --methods"):
        grid.check_overrides(["--spheret_p=0.3"], {})
    assert methods.valid_methods_text().startswith(
        "pre_ln, post_ln, pre_dyt, peri_ln, keel, lns, geonorm, proj_spheret, cay_spheret, p_spheret:P, ngpt"
    )


def test_help_lists_the_four_keys_with_their_connection() -> None:
    text = config_help()
    for line in (
        "--spheret_p=0.5               p of p-SpheretNorm: angle = p * arctan(beta / p) (connection p_spheret; in the method key)",
        "--dyt_alpha=0.5               initial scalar a of DyT(x) = g * tanh(a x) + b (connection pre_dyt)",
        "--keel_alpha=None             Keel's fixed residual scale; None means 2 * n_layer (connection keel)",
        "--peri_embed_ln=false         Peri-LN: also LayerNorm the embedding output (connection peri_ln)",
    ):
        assert f"  {line}\n" in text, line


# -----------------------------------------------------------------------------
# The old checks: one sentence each, with any connection


ERRORS = [
    ("spheret_p", "0", 0.0, "spheret_p must be > 0, got 0.0."),
    ("spheret_p", "-1", -1.0, "spheret_p must be > 0, got -1.0."),
    ("keel_alpha", "0", 0.0, "keel_alpha must be > 0 (or None for 2 * n_layer), got 0.0."),
    ("keel_alpha", "-2", -2.0, "keel_alpha must be > 0 (or None for 2 * n_layer), got -2.0."),
]


@pytest.mark.parametrize("key, text, value, message", ERRORS)
@pytest.mark.parametrize("connection", LEGACY_CONNECTIONS)
def test_the_old_checks_are_one_sentence_errors(connection: str, key: str, text: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config([f"--connection={connection}", f"--{key}={text}"], world_size=1)
    assert str(raised.value) == message
    with pytest.raises(ValueError) as raised:
        GPTConfig(connection=connection, **{key: value})
    assert str(raised.value) == message
    with pytest.raises(ValueError) as raised:
        config_from_dict(legacy_dict(connection, **{key: value}))
    assert str(raised.value) == message


def test_types_are_checked_in_one_sentence_too() -> None:
    with pytest.raises(ConfigError, match=r"^--keel_alpha='big': expected a number or None\.$"):
        parse_config(["--keel_alpha=big"], world_size=1)
    with pytest.raises(ValueError, match=r"^keel_alpha must be a float or None, got 'big'\.$"):
        GPTConfig(connection="keel", keel_alpha="big")
    with pytest.raises(ValueError, match=r"^peri_embed_ln must be true or false, got 1\.$"):
        config_from_dict(legacy_dict("peri_ln", peri_embed_ln=1))


def test_the_four_keys_are_no_longer_fields_and_read_as_attributes() -> None:
    assert not set(OWNER) & set(MODEL_FIELDS)
    for key, connection in OWNER.items():
        assert [p.key for p in CONNECTIONS[connection].params] == [key]
        cfg = GPTConfig(connection=connection, **{key: CHANGED[key]})
        assert getattr(cfg, key) == CHANGED[key] and cfg.connection_params == {key: CHANGED[key]}
        other = GPTConfig(connection="lns", **{key: CHANGED[key]})  # accepted, and ignored
        assert other.connection_params == {} and not hasattr(other, key)
    assert GPTConfig(connection="keel", n_layer=3).keel_scale == 6.0
    # A keyword wins over connection_params (train.py's {**the folder's keys, **the command line's}).
    cfg = GPTConfig(connection="p_spheret", connection_params={"spheret_p": 0.5}, spheret_p=2.0)
    assert cfg.spheret_p == 2.0 and replace(cfg, spheret_p=3.0).connection_params == {"spheret_p": 3.0}


# -----------------------------------------------------------------------------
# A connection's own key (any_connection off): refused with another connection, as in 3ab3f93


class _Gain(Connection):
    title = "Gain x{res_gain:g}"
    params = (MethodParam("res_gain", 0.5, "a gain"),)

    def __init__(self, config, layer_idx: int, slot: int = 0):
        super().__init__(config, layer_idx, slot)
        self.gain = config.res_gain

    def forward(self, h, sublayer):
        return h + self.gain * sublayer(h)


@pytest.fixture
def gain_connection():
    register_connection("test_gain")(_Gain)
    yield _Gain
    del CONNECTIONS["test_gain"]  # the registry-driven tests must not see it


def test_a_custom_key_is_refused_with_another_connection(gain_connection) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(["--connection=pre_ln", "--res_gain=0.3"], world_size=1)
    assert str(raised.value) == "connection_params ['res_gain'] are not parameters of connection 'pre_ln'; its parameters are: none."
    parsed = parse_config(["--connection=test_gain", "--res_gain=0.25", "--dyt_alpha=0.3"], world_size=1)
    cfg = parsed.model_config(vocab_size=50)
    assert cfg.connection_params == {"res_gain": 0.25}
    assert default_out_dir("x", cfg, parsed.overrides) == "out/x/test_gain-0.25+dyt_alpha=0.3"
    assert "res_gain" in method_keys_neutral()
    with pytest.raises(grid.UsageError, match="use --methods"):
        grid.check_overrides(["--res_gain=0.3"], {})
    assert model_key_conflicts({"res_gain": 0.3}, asdict(cfg)) == ["res_gain: checkpoint has 0.25, the config/command line asks for 0.3"]
