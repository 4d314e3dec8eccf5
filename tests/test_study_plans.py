"""The runs each CPU study's command plans with its default options (depth_study, block_study,
lr_sweep, mup_transfer, reproduce_cpu, fair_sweep): their train.py arguments and run folders, written
out here as the code planned them before these studies became specs on study.sweep_main, so that the
run folders already on disk keep being found and reused, not trained again.

Nothing trains: study.start_study is stopped once the command has designed its sweep, and the
plan is read from the sweep it was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from spheretnorm.experiments import block_variants, cpu_pipeline, depth, fair_comparison, lr_transfer, stability_sweep, study
from spheretnorm.experiments.study import Place, plan_points, train_argv

# The CPU model's keys as every study's argv holds them, batch 12 (depth, block) and 16 (the others).
MODEL = ("--dataset=shakespeare_char --n_layer=24 --n_head=4 --n_embd=128 --block_size=64 --batch_size={0} --global_batch_size={0} "
         "--eval_iters=10 --log_interval=10 --device=cpu --dtype=float32 --compile=True --compile_scope=blocks --wandb_log=False")
MODEL_12, MODEL_16 = MODEL.format(12), MODEL.format(16)


class Planned(Exception):
    """Raised in place of start_study: the sweep is designed, nothing is to run."""


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """plan(main, *options): each planned run's train.py arguments, joined by spaces, with the
    study's --out_dir written OUT and its --data_dir DATA."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The king and queen spoke to their good people at dawn.\n" * 400, encoding="utf-8")
    out, data = tmp_path / "out", tmp_path / "data"

    def planned(main: Callable[[list[str]], int], *options: str) -> list[str]:
        runs: list[str] = []

        def stop(sweep: study.Sweep, args: object, overrides: list[str]) -> None:
            place = Place.of(args, overrides)
            runs.extend(" ".join(train_argv(sweep, p, place)).replace(str(out), "OUT").replace(str(data), "DATA") for p in plan_points(sweep, {}))
            raise Planned

        monkeypatch.setattr(study, "start_study", stop)
        with pytest.raises(Planned):
            main(["--out_dir", str(out), "--data_dir", str(data), "--input", str(corpus), *options])
        return runs

    return planned


def folders(runs: list[str]) -> list[str]:
    return [run.split("--out_dir=OUT/", 1)[1].split()[0] for run in runs]


def test_the_depth_study_plans_its_runs_as_before(plan: Callable[..., list[str]]) -> None:
    runs = plan(depth.main)
    recipe = f"{MODEL_12} --beta2=0.99 --learning_rate=0.001 --min_lr=0.0001 --dropout=0.0 --warmup_iters=400 --max_iters=800 --lr_decay_iters=800 --eval_interval=100"
    assert runs[0] == f"--config_name=depth_study_seed1337 {recipe} --connection=pre_ln --alpha_index=block --seed=1337 --data_dir=DATA --out_dir=OUT/seed1337/pre_ln"
    assert runs[6] == (f"--config_name=depth_study_seed1337 {recipe} --connection=p_spheret --spheret_p=0.5 --alpha_index=sublayer --seed=1337 "
                       "--data_dir=DATA --out_dir=OUT/seed1337/p_spheret-0.5+alpha_index=sublayer")
    methods = ["pre_ln", "peri_ln", "geonorm", "p_spheret-0.5", "proj_spheret", "cay_spheret", "p_spheret-0.5+alpha_index=sublayer"]
    assert folders(runs) == [f"seed{s}/{m}" for s in (1337, 1338) for m in methods]


def test_the_block_study_plans_its_runs_as_before(plan: Callable[..., list[str]]) -> None:
    runs = plan(block_variants.main)
    head = f"--config_name=block_study_seed1337 {MODEL_12} --max_iters=800 --lr_decay_iters=800 --eval_interval=100"
    paper = "--beta2=0.99 --learning_rate=0.001 --min_lr=0.0001 --warmup_iters=400 --weight_decay=0.1 --dropout=0.0"
    assert runs[0] == f"{head} --connection=pre_ln --block=gpt2 --seed=1337 {paper} --data_dir=DATA --out_dir=OUT/seed1337/gpt2/pre_ln"
    assert runs[3] == (f"{head} --connection=ngpt --block=gpt2 --seed=1337 --beta2=0.99 --learning_rate=0.001 --min_lr=0.0 --warmup_iters=0 "
                       "--weight_decay=0.0 --dropout=0.0 --data_dir=DATA --out_dir=OUT/seed1337/gpt2/ngpt-lr0.001")
    assert runs[7] == f"{head} --connection=p_spheret --spheret_p=0.5 --block=llama --seed=1337 {paper} --data_dir=DATA --out_dir=OUT/seed1337/llama/p_spheret-0.5"
    variants = ["gpt2/pre_ln", "gpt2/p_spheret-0.5", "gpt2/geonorm", "gpt2/ngpt-lr0.001", "gpt2/ngpt-lr0.003", "gpt2/ngpt-lr0.01",
                "llama/pre_ln", "llama/p_spheret-0.5"]
    assert folders(runs) == [f"seed{s}/{v}" for s in (1337, 1338) for v in variants]


def test_the_lr_sweep_plans_its_runs_as_before(plan: Callable[..., list[str]]) -> None:
    runs = plan(stability_sweep.main)
    head = f"--config_name=shakespeare_char_24x128 {MODEL_16} --max_iters=200 --lr_decay_iters=200 --eval_interval=50"
    assert runs[0] == f"{head} --connection=pre_ln --learning_rate=0.001 --min_lr=0.0001 --warmup_iters=10 --data_dir=DATA --out_dir=OUT/shakespeare_char_24x128/pre_ln/lr0.001_wu10"
    assert runs[13] == (f"{head} --connection=proj_spheret --learning_rate=0.003 --min_lr=0.00030000000000000003 --warmup_iters=100 "
                        "--data_dir=DATA --out_dir=OUT/shakespeare_char_24x128/proj_spheret/lr0.003_wu100")
    methods = ["pre_ln", "proj_spheret", "p_spheret-0.5", "geonorm"]
    assert folders(runs) == [f"shakespeare_char_24x128/{m}/lr{lr}_wu{w}" for w in (10, 100) for lr in ("0.001", "0.003") for m in methods]
    # The user's overrides come last and name the study by the shape they give.
    deeper = plan(stability_sweep.main, "--n_layer=12")
    assert deeper[0] == (f"--config_name=shakespeare_char_12x128 {MODEL_16} --max_iters=200 --lr_decay_iters=200 --eval_interval=50 --connection=pre_ln "
                         "--learning_rate=0.001 --min_lr=0.0001 --warmup_iters=10 --data_dir=DATA --out_dir=OUT/shakespeare_char_12x128/pre_ln/lr0.001_wu10 --n_layer=12")


def test_the_mup_transfer_plans_its_runs_as_before(plan: Callable[..., list[str]]) -> None:
    runs = plan(lr_transfer.main)
    shape = ("--dataset=shakespeare_char --n_layer=3 --n_head={0} --n_embd={1} --block_size=64 --batch_size=16 --global_batch_size=16 --eval_iters=20 "
             "--log_interval=10 --device=cpu --dtype=float32 --compile=True --compile_scope=blocks --wandb_log=False --warmup_iters=25 --max_iters=250 "
             "--lr_decay_iters=250 --eval_interval=250 --connection=p_spheret --spheret_p=0.5")
    assert runs[0] == (f"--config_name=mup_transfer {shape.format(2, 64)} --optimizer=adamw --mup_base_width=0 --learning_rate=0.001 --min_lr=0.0001 "
                       "--data_dir=DATA --out_dir=OUT/p_spheret-0.5/w64_standard/lr0.001")
    assert runs[15] == (f"--config_name=mup_transfer {shape.format(8, 256)} --optimizer=adamw --mup_base_width=64 --learning_rate=0.001 --min_lr=0.0001 "
                        "--data_dir=DATA --out_dir=OUT/p_spheret-0.5/w256_mup/lr0.001")
    lrs = ("0.001", "0.002", "0.004", "0.008", "0.016")
    # At the base width, 64, μP is the standard parametrisation: its points share the standard run's folder.
    assert folders(runs) == [f"{m}/{w}/lr{lr}" for m in ("p_spheret-0.5", "pre_ln") for w in ("w64_standard", "w64_standard", "w256_standard", "w256_mup")
                             for lr in lrs]
    muon = plan(lr_transfer.main, "--optimizers", "adamw,muon")
    assert muon[35] == (f"--config_name=mup_transfer {shape.format(8, 256)} --optimizer=muon --mup_base_width=64 --muon_lr=0.005 --learning_rate=0.004 "
                        "--min_lr=0.0004 --data_dir=DATA --out_dir=OUT/p_spheret-0.5/muon/w256_mup/lr0.005")
    assert folders(muon)[20:25] == [f"p_spheret-0.5/muon/w64_standard/lr{lr}" for lr in ("0.005", "0.01", "0.02", "0.04", "0.08")]


def test_the_cpu_reproduction_plans_its_runs_as_before(plan: Callable[..., list[str]]) -> None:
    runs = plan(cpu_pipeline.main)
    assert runs[0] == (f"--config_name=shakespeare_char_24x128 {MODEL_16} --learning_rate=0.001 --min_lr=0.0001 --warmup_iters=100 --max_iters=400 "
                       "--lr_decay_iters=400 --eval_interval=50 --connection=pre_ln --data_dir=DATA --out_dir=OUT/shakespeare_char_24x128/pre_ln")
    methods = ["pre_ln", "pre_dyt", "peri_ln", "keel", "geonorm", "p_spheret-0.5", "proj_spheret", "cay_spheret"]
    assert folders(runs) == [f"shakespeare_char_24x128/{m}" for m in methods]


def test_the_fair_sweep_plans_its_runs_as_before(plan: Callable[..., list[str]]) -> None:
    """Its first seed's grid, every arm in both blocks (no run finished: the follow-ups add the rest)."""
    shape = ("--config_name=fair_sweep --dataset=shakespeare_char --n_layer=12 --n_head=4 --n_embd=64 --block_size=64 --batch_size=16 "
             "--global_batch_size=16 --eval_iters=10 --log_interval=10 --device=cpu --dtype=float32 --compile=True --compile_scope=blocks "
             "--wandb_log=False --eval_interval=120")
    paper = "--beta1=0.9 --beta2=0.99 --weight_decay=0.1 --dropout=0.0 --warmup_iters=100"
    runs = plan(fair_comparison.main)
    assert runs[0] == (f"{shape} --block=gpt2 --seed=1337 --connection=pre_ln {paper} --learning_rate=0.001 --min_lr=0.0001 --max_iters=600 "
                       "--lr_decay_iters=600 --data_dir=DATA --out_dir=OUT/gpt2/pre_ln/lr0.001_s1337")
    assert runs[12] == (f"{shape} --block=gpt2 --seed=1337 --connection=ngpt --beta1=0.9 --beta2=0.95 --weight_decay=0.0 --dropout=0.0 "
                        "--warmup_iters=0 --learning_rate=0.001 --min_lr=0.0 --max_iters=600 --lr_decay_iters=600 --data_dir=DATA --out_dir=OUT/gpt2/ngpt/lr0.001_s1337")
    assert runs[63] == (f"{shape} --block=llama --seed=1337 --connection=p_spheret --spheret_p=0.5 {paper} --learning_rate=0.008 --min_lr=0.0008 "
                        "--max_iters=600 --lr_decay_iters=600 --alpha_cap_grad=straight_through --data_dir=DATA "
                        "--out_dir=OUT/llama/p_spheret-0.5+alpha_cap_grad=straight_through/lr0.008_s1337")
    arms = ["pre_ln", "p_spheret-0.5", "geonorm", "ngpt", "p_spheret-0.5+alpha_cap=none", "p_spheret-0.5+alpha_decay=none",
            "p_spheret-0.5+sphere_input_gain", "p_spheret-0.5+alpha_cap_grad=straight_through"]
    assert folders(runs) == [f"{b}/{a}/lr{lr}_s1337" for b in ("gpt2", "llama") for a in arms for lr in ("0.001", "0.002", "0.004", "0.008")]
    # Another optimizer than AdamW: its folders apart (AdamW's are the first design's), nGPT with AdamW alone.
    muonh = plan(fair_comparison.main, "--optimizers", "adamw,muonh", "--arms", "pre_ln,p_spheret-0.5,ngpt", "--blocks", "llama", "--lrs", "1e-3,2e-3")
    assert muonh[2] == (f"{shape} --block=llama --optimizer=muonh --seed=1337 --connection=pre_ln {paper} --learning_rate=0.002 --min_lr=0.0002 "
                        "--max_iters=600 --lr_decay_iters=600 --hyperball_lr=0.005 --hyperball_radius=1.0 --data_dir=DATA --out_dir=OUT/llama/pre_ln+muonh/lr0.005_s1337")
    rates = ("0.005", "0.01", "0.02", "0.04", "0.08")
    assert folders(muonh) == ["llama/pre_ln/lr0.001_s1337", "llama/pre_ln/lr0.002_s1337", *(f"llama/pre_ln+muonh/lr{r}_s1337" for r in rates),
                              "llama/p_spheret-0.5/lr0.001_s1337", "llama/p_spheret-0.5/lr0.002_s1337",
                              *(f"llama/p_spheret-0.5+muonh/lr{r}_s1337" for r in rates), "llama/ngpt/lr0.001_s1337", "llama/ngpt/lr0.002_s1337"]
