"""A user's module cannot capture a built-in or a key (issue 48, point 4).

Registering a connection or an optimizer under a built-in's name, or declaring a key of the model,
of training or of another entry (an optimizer's max_iters, a connection's muon_lr), is refused in
one sentence naming the module; the registries are left as they were. A module imported again
(under its name or from its file under another) registers its classes again without a word.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import spheretnorm.runtime.config  # noqa: F401 (loaded first, as every command loads it: its keys are training's)
from spheretnorm.model import CONNECTIONS, MethodParam, PreLN, register_connection
from spheretnorm.optim import OPTIMIZERS, OptimizerRecipe, register_optimizer
from spheretnorm.runtime.imports import ImportsError, import_modules
from test_export_own_module import import_file

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def registries() -> Iterator[None]:
    """Both registries as they were before the test, in their order (other files read them)."""
    saved = {id(r): dict(r) for r in (CONNECTIONS, OPTIMIZERS)}
    yield
    for registry in (CONNECTIONS, OPTIMIZERS):
        registry.clear()
        registry.update(saved[id(registry)])


def user_class(base: type, name: str, *params: MethodParam) -> type:
    """A class as a user's module 'my_ideas' defines it."""
    return type(name, (base,), {"params": params, "__module__": "my_ideas"})


def refusal(register: Callable[[], object]) -> str:
    with pytest.raises(ValueError) as info:
        register()
    message = str(info.value)
    assert message.startswith("Module 'my_ideas' is refused: ") and "\n" not in message and message.count(". ") == 0, message
    return message


@pytest.mark.parametrize("kind, name", [("optimizer", "adamw"), ("optimizer", "muon"), ("connection", "pre_ln"), ("connection", "p_spheret")])
def test_a_built_in_name_is_refused_and_kept(kind: str, name: str) -> None:
    registry, register, base = (OPTIMIZERS, register_optimizer, OptimizerRecipe) if kind == "optimizer" else (CONNECTIONS, register_connection, PreLN)
    built_in = registry[name]
    message = refusal(lambda: register(name)(user_class(base, "Mine")))
    assert f"{kind} name {name!r} is a built-in name" in message
    assert registry[name] is built_in


KEYS = {
    "optimizer max_iters": ("optimizer", "max_iters", "training (spheretnorm.runtime.config.TrainConfig)"),
    "optimizer learning_rate": ("optimizer", "learning_rate", "training (spheretnorm.runtime.config.TrainConfig)"),
    "connection max_iters": ("connection", "max_iters", "training (spheretnorm.runtime.config.TrainConfig)"),
    "connection out_dir": ("connection", "out_dir", "training (spheretnorm.runtime.config.TrainConfig)"),
    "connection muon_lr": ("connection", "muon_lr", "optimizer 'muon'"),
    "connection n_embd": ("connection", "n_embd", "the model (GPTConfig)"),
    "optimizer spheret_p": ("optimizer", "spheret_p", "the model (connection 'p_spheret')"),
}


@pytest.mark.parametrize("case", list(KEYS))
def test_a_key_of_training_or_of_another_entry_is_refused(case: str) -> None:
    kind, key, owner = KEYS[case]
    register, base = (register_optimizer, OptimizerRecipe) if kind == "optimizer" else (register_connection, PreLN)
    message = refusal(lambda: register("mine")(user_class(base, "Mine", MethodParam(key, 1, "x"))))
    assert f"{kind} 'mine' declares [{key!r}], already keys of {owner}; " in message
    assert "mine" not in CONNECTIONS and "mine" not in OPTIMIZERS


def test_another_modules_name_is_refused() -> None:
    register_connection("mine")(user_class(PreLN, "Mine"))
    other = type("Theirs", (PreLN,), {"__module__": "their_ideas"})
    with pytest.raises(ValueError, match=r"^Module 'their_ideas' is refused: connection name 'mine' is taken by Mine of module 'my_ideas'; "):
        register_connection("mine")(other)


@pytest.mark.parametrize("file", ["lion_optimizer.py", "toy_optimizer.py"])
def test_a_test_module_imported_again_registers_again(file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under its own name, then from its file under another: the same class, replaced."""
    first = import_file(TESTS / file, file[:-3], monkeypatch)
    again = import_file(TESTS / file, f"again_{file[:-3]}", monkeypatch)
    name = getattr(first, "NAME", "fixture_lion")
    assert OPTIMIZERS[name].__module__ == again.__name__


CONNECTION_MODULE = '''
from spheretnorm.model import MethodParam, PreLN, register_connection

GAIN = MethodParam("own_gain", 0.5, "a gain", check=lambda g: g > 0, must="> 0")


@register_connection("own_a")
class OwnA(PreLN):
    params = (GAIN,)


@register_connection("own_b")
class OwnB(PreLN):
    params = (GAIN,)
'''


def test_a_connection_module_imported_twice_keeps_its_shared_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its shared key's check is a new function the second time, and still the module's own key."""
    (tmp_path / "own_connections.py").write_text(CONNECTION_MODULE)
    import_file(tmp_path / "own_connections.py", "own_connections", monkeypatch)
    again = import_file(tmp_path / "own_connections.py", "own_connections", monkeypatch)
    assert CONNECTIONS["own_a"] is again.OwnA and CONNECTIONS["own_b"] is again.OwnB


def test_the_command_line_names_the_refused_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "greedy_optimizer.py").write_text(
        "from spheretnorm.model import MethodParam\nfrom spheretnorm.optim import OptimizerRecipe, register_optimizer\n\n\n"
        "@register_optimizer('greedy')\nclass Greedy(OptimizerRecipe):\n    params = (MethodParam('max_iters', 10, 'x'),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "greedy_optimizer", raising=False)
    with pytest.raises(ImportsError) as info:
        import_modules(["greedy_optimizer"])
    sys.modules.pop("greedy_optimizer", None)
    assert "Module 'greedy_optimizer' is refused: optimizer 'greedy' declares ['max_iters'], already keys of training" in str(info.value)
    assert "\n" not in str(info.value) and "greedy" not in OPTIMIZERS



def test_the_fixtures_leave_the_natural_names_to_a_researchers_own_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest --imports=my_module with one's own Lion and z-loss: the fixtures' names and keys are
    not the natural ones, so both register beside them (issue 65, item 5)."""
    from spheretnorm.runtime.loss_terms import LOSS_TERMS

    import_file(TESTS / "lion_optimizer.py", "lion_optimizer", monkeypatch)
    import_file(TESTS / "zloss_term.py", "zloss_term", monkeypatch)
    mine = tmp_path / "my_ideas.py"
    mine.write_text(
        "import torch\n"
        "from spheretnorm.model import MethodParam\n"
        "from spheretnorm.optim import OPTIMIZERS, register_optimizer\n"
        "from spheretnorm.runtime.loss_terms import register_loss_term\n\n"
        "@register_optimizer('lion')\n"
        "class MyLion(OPTIMIZERS['adamw']):\n"
        "    title = 'my Lion'\n"
        "    params = (MethodParam('lion_lr', 3e-4, 'my Lion rate'),)\n\n"
        "@register_loss_term('z_loss', MethodParam('z_loss', 0.0, 'my z-loss'))\n"
        "def z_loss(logits, targets, train):\n"
        "    return train.z_loss * torch.logsumexp(logits, -1).pow(2).mean()\n")
    try:
        import_file(mine, "my_ideas", monkeypatch)
        assert OPTIMIZERS["lion"].__module__ == "my_ideas" and OPTIMIZERS["fixture_lion"].__module__ != "my_ideas"
        assert "z_loss" in LOSS_TERMS and "fixture_z_loss" in LOSS_TERMS
    finally:
        OPTIMIZERS.pop("lion", None)
        LOSS_TERMS.pop("z_loss", None)
