"""Tests of the offline benchmarks (spheretnorm/zeroshot/local_tasks.py) and the HF cache prefetch (spheretnorm/zeroshot/hub_prefetch.py).

Every benchmark gets a few realistic records in its authors' original release format, written
into a tmp folder. The same documents are also written here by hand in the schema of the Hugging
Face dataset that lm-eval's built-in task reads, with a task YAML that includes the built-in one
(the way a user would point lm-eval at local data). The converter must produce exactly those
records, and lm-eval must score both versions identically: same prompts, targets and metrics.
All offline, on a tiny random model.
"""

from __future__ import annotations

import os

# No network here: datasets / huggingface_hub must not try the hub (set before they are imported).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json
import re
from pathlib import Path
from typing import Any

import lm_eval.tasks
import pytest
import torch
import yaml
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from spheretnorm.runtime.checkpoint import checkpoint_state
from spheretnorm.zeroshot import lm_eval_entry as lm_eval_cli, hub_prefetch as prefetch, driver as zero_shot
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.harness import NanoGPTLM
from spheretnorm.zeroshot.local_tasks import (
    LOCAL_TASKS,
    convert_task,
    data_source_note,
    social_iqa_records,
    winogrande_records,
    write_local_tasks,
)
from spheretnorm.zeroshot.driver import PAPER_TASKS
from spheretnorm.model import GPT, GPTConfig

BUILTIN = Path(lm_eval.tasks.__file__).parent

# -----------------------------------------------------------------------------
# The benchmarks in their original release formats

ARC_CHALLENGE = [
    {"id": "Mercury_7175875", "question": {"stem": "An astronomer observes that a planet rotates faster after a meteorite impact. Which is the most likely effect of this increase in rotation?", "choices": [{"text": "Planetary density will decrease.", "label": "A"}, {"text": "Planetary years will become longer.", "label": "B"}, {"text": "Planetary days will become shorter.", "label": "C"}, {"text": "Planetary gravity will become stronger.", "label": "D"}]}, "answerKey": "C"},
    {"id": "NYSEDREGENTS_2015_4_8", "question": {"stem": "Which object in our solar system reflects light and is a satellite that orbits around one planet?", "choices": [{"text": "Earth", "label": "1"}, {"text": "Mercury", "label": "2"}, {"text": "the Sun", "label": "3"}, {"text": "the Moon", "label": "4"}]}, "answerKey": "4"},
    {"id": "Mercury_SC_401169", "question": {"stem": "Which tool should a student use to compare the masses of two small rocks?", "choices": [{"text": "balance", "label": "A"}, {"text": "hand lens", "label": "B"}, {"text": "ruler", "label": "C"}]}, "answerKey": "A"},
]
ARC_EASY = [
    {"id": "Mercury_417466", "question": {"stem": "Which statement best explains why photosynthesis is the foundation of most food webs?", "choices": [{"text": "Sunlight is the source of energy for nearly all ecosystems.", "label": "A"}, {"text": "Most ecosystems are found on land instead of in water.", "label": "B"}, {"text": "Carbon dioxide is more available than other gases.", "label": "C"}, {"text": "The producers in all ecosystems are plants.", "label": "D"}]}, "answerKey": "A"},
    {"id": "MCAS_2000_4_6", "question": {"stem": "Which technology was developed most recently?", "choices": [{"text": "cellular telephone", "label": "A"}, {"text": "television", "label": "B"}, {"text": "refrigerator", "label": "C"}, {"text": "airplane", "label": "D"}, {"text": "radio", "label": "E"}]}, "answerKey": "A"},
    {"id": "NYSEDREGENTS_2010_4_29", "question": {"stem": "Which form of energy is needed to change water from a liquid to a gas?", "choices": [{"text": "heat", "label": "1"}, {"text": "electrical", "label": "2"}, {"text": "sound", "label": "3"}, {"text": "magnetic", "label": "4"}]}, "answerKey": "1"},
]
OPENBOOKQA = [
    {"id": "8-343", "question": {"stem": "A person wants to start saving money so that they can afford a nice vacation at the end of the year. After looking over their budget and expenses, they decide the best way to save money is to", "choices": [{"text": "make more phone calls", "label": "A"}, {"text": "quit eating lunch out", "label": "B"}, {"text": "buy less with monopoly money", "label": "C"}, {"text": "have lunch with friends", "label": "D"}]}, "answerKey": "B"},
    {"id": "1129", "question": {"stem": "There is most likely going to be fog around:", "choices": [{"text": "a marsh", "label": "A"}, {"text": "a tundra", "label": "B"}, {"text": "the plains", "label": "C"}, {"text": "a desert", "label": "D"}]}, "answerKey": "A"},
    {"id": "880", "question": {"stem": "Predators eat", "choices": [{"text": "lions", "label": "A"}, {"text": "humans", "label": "B"}, {"text": "bunnies", "label": "C"}, {"text": "grass", "label": "D"}]}, "answerKey": "C"},
]
BOOLQ = [
    {"question": "does ethanol take more energy make that produces", "title": "Ethanol fuel", "answer": False, "passage": "All biomass goes through at least some of these steps: it needs to be grown, collected, dried, fermented, distilled, and burned."},
    {"question": "is house tax and property tax are same", "title": "Property tax", "answer": True, "passage": "Property tax or 'house tax' is a local tax on buildings, along with appurtenant land."},
    {"question": "is pain experienced in a missing body part or paralyzed area", "title": "Phantom pain", "answer": True, "passage": "Phantom pain sensations are described as perceptions that an individual experiences relating to a limb or an organ that is not physically part of the body."},
]
SOCIAL_IQA = [
    {"context": "Tracy didn't go home that evening and resisted Riley's attacks.", "question": "What does Tracy need to do before this?", "answerA": "make a new plan", "answerB": "Go home and see Riley", "answerC": "Find somewhere to go"},
    {"context": "Sydney walked past a homeless woman asking for change but did not have any money they could give to her.", "question": "How would you describe Sydney?", "answerA": "sympathetic", "answerB": "like a person who was unable to help", "answerC": "incredulous"},
    {"context": "Sasha protected the patients' rights by making new laws regarding cancer drug trials.", "question": "What will patients want to do next?", "answerA": "write new laws", "answerB": "get petitions signed", "answerC": "live longer"},
]
SOCIAL_IQA_LABELS = "3\n1\n3\n"
WINOGRANDE = [
    {"qID": "3FCO4VKOZ4BJQ6CTEA0XD5S4RLIEA7-1", "sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.", "option1": "Sarah", "option2": "Maria", "answer": "1"},
    {"qID": "3FCO4VKOZ4BJQ6CTEA0XD5S4RLIEA7-2", "sentence": "Sarah was a much better surgeon than Maria so _ always got the easier cases.", "option1": "Sarah", "option2": "Maria", "answer": "2"},
    {"qID": "3LOJFQ4BOXOWA0M9RYR2BH7K1AND9X-1", "sentence": "They were worried the wine would ruin the bed and the blanket, but the _ was't ruined.", "option1": "blanket", "option2": "bed", "answer": "2"},
]
WINOGRANDE_LABELS = "1\n2\n2\n"
HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3, "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "source_id": "activitynet~v_-JhWjGDPHMY"},
    {"ind": 92, "activity_label": "Home and Garden", "ctx_a": "[header] How to clean a grill [title] Heat the grill. [step] Turn the burners to high and close the lid.", "ctx_b": "", "ctx": "[header] How to clean a grill [title] Heat the grill. [step] Turn the burners to high and close the lid.", "split": "val", "split_type": "zeroshot", "label": 0, "endings": ["Let it heat for fifteen minutes so the residue turns to ash. [title] Scrub the grates.", "[step] Pour cold water on the charcoal.", "Paint the lid with a brush. [substeps] Use red paint.", "Wait for the neighbors to come over."], "source_id": "wikihow~20374"},
    {"ind": 106, "activity_label": "Clean and jerk", "ctx_a": "A lady walks to a barbell. She bends down and grabs the pole.", "ctx_b": "the lady", "ctx": "A lady walks to a barbell. She bends down and grabs the pole. the lady", "split": "val", "split_type": "indomain", "label": 3, "endings": ["swings and lands in her arms.", "pulls the barbell forward.", "pulls a rope attached to the barbell.", "stands and lifts the weight over her head."], "source_id": "activitynet~v_-lJS58hyo1c"},
]
SCIQ = [
    {"question": "Compounds that are capable of accepting electrons, such as o 2 or f2, are called what?", "distractor3": "residues", "distractor1": "antioxidants", "distractor2": "Oxygen", "correct_answer": "oxidants", "support": "Oxidants and Reductants Compounds that are capable of accepting electrons, such as O 2 or F 2, are called oxidants (or oxidizing agents) because they can oxidize other compounds."},
    {"question": "What term in biotechnology means a genetically exact copy of an organism?", "distractor3": "adult", "distractor1": "male", "distractor2": "phenotype", "correct_answer": "clone", "support": ""},
    {"question": "Vertebrata are characterized by the presence of what?", "distractor3": "Bones", "distractor1": "Muscles", "distractor2": "Thumbs", "correct_answer": "backbone", "support": "\nVertebrates are chordates with a backbone made of vertebrae."},
]
LAMBADA = [
    {"text": "In my palm is a clear stone, and inside it is a small ivory statuette. A guardian angel. \"Figured if you're going to be out at night getting hit by cars, you might as well have some backup.\" I look at him, feeling stunned. Like this is some sort of sign. But as I stare at Harlin"},
    {"text": "Give me a minute to change and I'll meet you at the docks.\" She'd forced those words through her teeth. \"No need to change. We won't be that long.\" Shane gripped her arm and started leading her to the dock. \"I can make it there on my own, Shane"},
]
WIKITEXT_RAW = " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a tactical role @-@ playing video game . \n \n = = Gameplay = = \n \n As with previous games , it is played in turns . \n \n = Tower Building of the Little Rock Arsenal = \n \n The Tower Building is a building in Little Rock , Arkansas . \n"
PIQA = [
    {"goal": "How do I ready a guinea pig cage for it's new occupants?", "sol1": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips.", "sol2": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material."},
    {"goal": "dresser", "sol1": "replace drawer with bobby pin ", "sol2": "finish, woodgrain with  bobby pin "},
]
PIQA_LABELS = "0\n1\n"


def jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def write_release_files(root: Path) -> Path:
    """The 11 benchmarks under root, laid out and formatted as their authors released them."""
    files = {
        "arc/ARC-Challenge-Test.jsonl": jsonl(ARC_CHALLENGE),
        "arc/ARC-Easy-Test.jsonl": jsonl(ARC_EASY),
        "openbookqa/test.jsonl": jsonl(OPENBOOKQA),
        "boolq/dev.jsonl": jsonl(BOOLQ),
        "socialiqa/dev.jsonl": jsonl(SOCIAL_IQA),
        "socialiqa/dev-labels.lst": SOCIAL_IQA_LABELS,
        "winogrande/dev.jsonl": jsonl(WINOGRANDE),
        "winogrande/dev-labels.lst": WINOGRANDE_LABELS,
        "hellaswag/hellaswag_val.jsonl": jsonl(HELLASWAG),
        "sciq/test.json": json.dumps(SCIQ, indent=1),  # one JSON array, as released
        "lambada_openai/lambada_test.jsonl": jsonl(LAMBADA),
        "wikitext2/wiki.test.raw": WIKITEXT_RAW,
        "piqa/valid.jsonl": jsonl(PIQA),
        "piqa/valid-labels.lst": PIQA_LABELS,
    }
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return root


# -----------------------------------------------------------------------------
# The same documents, written by hand in the hub datasets' schemas

HUB_RECORDS: dict[str, list[dict[str, Any]]] = {
    "arc_challenge": [
        {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a meteorite impact. Which is the most likely effect of this increase in rotation?", "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.", "Planetary days will become shorter.", "Planetary gravity will become stronger."], "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
        {"id": "NYSEDREGENTS_2015_4_8", "question": "Which object in our solar system reflects light and is a satellite that orbits around one planet?", "choices": {"text": ["Earth", "Mercury", "the Sun", "the Moon"], "label": ["1", "2", "3", "4"]}, "answerKey": "4"},
        {"id": "Mercury_SC_401169", "question": "Which tool should a student use to compare the masses of two small rocks?", "choices": {"text": ["balance", "hand lens", "ruler"], "label": ["A", "B", "C"]}, "answerKey": "A"},
    ],
    "arc_easy": [
        {"id": "Mercury_417466", "question": "Which statement best explains why photosynthesis is the foundation of most food webs?", "choices": {"text": ["Sunlight is the source of energy for nearly all ecosystems.", "Most ecosystems are found on land instead of in water.", "Carbon dioxide is more available than other gases.", "The producers in all ecosystems are plants."], "label": ["A", "B", "C", "D"]}, "answerKey": "A"},
        {"id": "MCAS_2000_4_6", "question": "Which technology was developed most recently?", "choices": {"text": ["cellular telephone", "television", "refrigerator", "airplane", "radio"], "label": ["A", "B", "C", "D", "E"]}, "answerKey": "A"},
        {"id": "NYSEDREGENTS_2010_4_29", "question": "Which form of energy is needed to change water from a liquid to a gas?", "choices": {"text": ["heat", "electrical", "sound", "magnetic"], "label": ["1", "2", "3", "4"]}, "answerKey": "1"},
    ],
    "openbookqa": [
        {"id": "8-343", "question_stem": "A person wants to start saving money so that they can afford a nice vacation at the end of the year. After looking over their budget and expenses, they decide the best way to save money is to", "choices": {"text": ["make more phone calls", "quit eating lunch out", "buy less with monopoly money", "have lunch with friends"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
        {"id": "1129", "question_stem": "There is most likely going to be fog around:", "choices": {"text": ["a marsh", "a tundra", "the plains", "a desert"], "label": ["A", "B", "C", "D"]}, "answerKey": "A"},
        {"id": "880", "question_stem": "Predators eat", "choices": {"text": ["lions", "humans", "bunnies", "grass"], "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
    ],
    "boolq": [
        {"question": "does ethanol take more energy make that produces", "passage": "All biomass goes through at least some of these steps: it needs to be grown, collected, dried, fermented, distilled, and burned.", "idx": 0, "label": 0},
        {"question": "is house tax and property tax are same", "passage": "Property tax or 'house tax' is a local tax on buildings, along with appurtenant land.", "idx": 1, "label": 1},
        {"question": "is pain experienced in a missing body part or paralyzed area", "passage": "Phantom pain sensations are described as perceptions that an individual experiences relating to a limb or an organ that is not physically part of the body.", "idx": 2, "label": 1},
    ],
    "social_iqa": [
        {"context": "Tracy didn't go home that evening and resisted Riley's attacks.", "question": "What does Tracy need to do before this?", "answerA": "make a new plan", "answerB": "Go home and see Riley", "answerC": "Find somewhere to go", "label": "3"},
        {"context": "Sydney walked past a homeless woman asking for change but did not have any money they could give to her.", "question": "How would you describe Sydney?", "answerA": "sympathetic", "answerB": "like a person who was unable to help", "answerC": "incredulous", "label": "1"},
        {"context": "Sasha protected the patients' rights by making new laws regarding cancer drug trials.", "question": "What will patients want to do next?", "answerA": "write new laws", "answerB": "get petitions signed", "answerC": "live longer", "label": "3"},
    ],
    "winogrande": [
        {"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.", "option1": "Sarah", "option2": "Maria", "answer": "1"},
        {"sentence": "Sarah was a much better surgeon than Maria so _ always got the easier cases.", "option1": "Sarah", "option2": "Maria", "answer": "2"},
        {"sentence": "They were worried the wine would ruin the bed and the blanket, but the _ was't ruined.", "option1": "blanket", "option2": "bed", "answer": "2"},
    ],
    "hellaswag": [
        {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"},
        {"ind": 92, "activity_label": "Home and Garden", "ctx_a": "[header] How to clean a grill [title] Heat the grill. [step] Turn the burners to high and close the lid.", "ctx_b": "", "ctx": "[header] How to clean a grill [title] Heat the grill. [step] Turn the burners to high and close the lid.", "endings": ["Let it heat for fifteen minutes so the residue turns to ash. [title] Scrub the grates.", "[step] Pour cold water on the charcoal.", "Paint the lid with a brush. [substeps] Use red paint.", "Wait for the neighbors to come over."], "source_id": "wikihow~20374", "split": "val", "split_type": "zeroshot", "label": "0"},
        {"ind": 106, "activity_label": "Clean and jerk", "ctx_a": "A lady walks to a barbell. She bends down and grabs the pole.", "ctx_b": "the lady", "ctx": "A lady walks to a barbell. She bends down and grabs the pole. the lady", "endings": ["swings and lands in her arms.", "pulls the barbell forward.", "pulls a rope attached to the barbell.", "stands and lifts the weight over her head."], "source_id": "activitynet~v_-lJS58hyo1c", "split": "val", "split_type": "indomain", "label": "3"},
    ],
    "sciq": [
        {"question": "Compounds that are capable of accepting electrons, such as o 2 or f2, are called what?", "distractor3": "residues", "distractor1": "antioxidants", "distractor2": "Oxygen", "correct_answer": "oxidants", "support": "Oxidants and Reductants Compounds that are capable of accepting electrons, such as O 2 or F 2, are called oxidants (or oxidizing agents) because they can oxidize other compounds."},
        {"question": "What term in biotechnology means a genetically exact copy of an organism?", "distractor3": "adult", "distractor1": "male", "distractor2": "phenotype", "correct_answer": "clone", "support": ""},
        {"question": "Vertebrata are characterized by the presence of what?", "distractor3": "Bones", "distractor1": "Muscles", "distractor2": "Thumbs", "correct_answer": "backbone", "support": "\nVertebrates are chordates with a backbone made of vertebrae."},
    ],
    "lambada_openai": LAMBADA,  # the release file is already the hub's schema
    "wikitext": [
        {"page": " = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a tactical role @-@ playing video game . \n \n = = Gameplay = = \n \n As with previous games , it is played in turns . \n "},
        {"page": " = Tower Building of the Little Rock Arsenal = \n \n The Tower Building is a building in Little Rock , Arkansas . \n"},
    ],
    "piqa": [{**PIQA[0], "label": 0}, {**PIQA[1], "label": 1}],
}

# lm-eval's built-in YAML of each task and the split it evaluates, as lm-eval 0.4 ships them.
BUILTIN_TASKS = {
    "arc_challenge": ("arc/arc_challenge.yaml", "test"),
    "arc_easy": ("arc/arc_easy.yaml", "test"),
    "openbookqa": ("openbookqa/openbookqa.yaml", "test"),
    "boolq": ("super_glue/boolq/default.yaml", "validation"),
    "social_iqa": ("siqa/siqa.yaml", "validation"),
    "winogrande": ("winogrande/default.yaml", "validation"),
    "hellaswag": ("hellaswag/hellaswag.yaml", "validation"),
    "sciq": ("sciq/sciq.yaml", "test"),
    "lambada_openai": ("lambada/lambada_openai.yaml", "test"),
    "wikitext": ("wikitext/wikitext.yaml", "test"),
    "piqa": ("piqa/piqa.yaml", "validation"),
}


def write_hub_style_tasks(root: Path) -> Path:
    """Each task as a user would point lm-eval at hub-schema data: the built-in YAML, json data files."""
    root.mkdir(parents=True, exist_ok=True)
    for task, (builtin, split) in BUILTIN_TASKS.items():
        data = root / f"{task}.jsonl"
        data.write_text(jsonl(HUB_RECORDS[task]), encoding="utf-8")
        config = {
            "include": str(BUILTIN / builtin),
            "task": task,
            "tag": [],
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(data)}},
            "training_split": None,
            "validation_split": split if split == "validation" else None,
            "test_split": split if split == "test" else None,
        }
        (root / f"hub_{task}.yaml").write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    return root


# -----------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_release_files(tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def tiny_lm() -> NanoGPTLM:
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50304, connection="p_spheret")
    return NanoGPTLM(model=GPT(config).eval(), batch_size=16)


def evaluate(lm: NanoGPTLM, include_path: Path) -> dict[str, Any]:
    manager = TaskManager(include_path=str(include_path), include_defaults=False)
    return simple_evaluate(model=lm, tasks=list(BUILTIN_TASKS), task_manager=manager, bootstrap_iters=0, log_samples=True)


def scored_requests(results: dict[str, Any], task: str) -> list[tuple[Any, ...]]:
    """(doc_id, target, request arguments, scores) of every sample, in document order."""
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return [(s["doc_id"], s["target"], json.dumps(s["arguments"]), json.dumps(s["filtered_resps"])) for s in samples]


# -----------------------------------------------------------------------------
# Conversion and evaluation against the hub-schema documents


def test_every_paper_task_has_a_local_version() -> None:
    assert set(LOCAL_TASKS) == set(PAPER_TASKS) == set(BUILTIN_TASKS)


@pytest.mark.parametrize("task", list(BUILTIN_TASKS))
def test_converted_records_are_the_hub_records(release_dir: Path, task: str) -> None:
    assert convert_task(release_dir, task) == HUB_RECORDS[task]


def test_local_tasks_score_exactly_as_the_builtin_tasks_on_hub_records(release_dir: Path, tiny_lm: NanoGPTLM, tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    assert write_local_tasks(release_dir, local_dir) == list(LOCAL_TASKS)
    local = evaluate(tiny_lm, local_dir)
    hub = evaluate(tiny_lm, write_hub_style_tasks(tmp_path / "hub"))
    for task in BUILTIN_TASKS:
        assert local["n-samples"][task]["effective"] == len(HUB_RECORDS[task])
        # Same prompts, continuations and targets, request by request, hence the same scores.
        assert scored_requests(local, task) == scored_requests(hub, task)
        metrics = {k: v for k, v in hub["results"][task].items() if k.endswith(",none")}
        assert metrics and {k: local["results"][task][k] for k in metrics} == metrics
    # The prompts are the built-in tasks' (e.g. HellaSwag's process_docs ran: no '[title]' left).
    hellaswag = sorted(local["samples"]["hellaswag"], key=lambda s: s["doc_id"])
    assert hellaswag[1]["arguments"][0][0].startswith("Home and Garden: How to clean a grill. Heat the grill.")
    assert hellaswag[1]["target"] == 0 and hellaswag[0]["target"] == 3
    arc = sorted(local["samples"]["arc_challenge"], key=lambda s: s["doc_id"])
    assert arc[1]["target"] == 3 and arc[1]["arguments"][3][1] == " the Moon"  # numeric answerKey '4'


def test_social_iqa_reads_correct_letters_or_the_labels_file() -> None:
    with_letters = jsonl([{**r, "correct": c} for r, c in zip(SOCIAL_IQA, "CAC")])
    assert social_iqa_records(with_letters, None) == HUB_RECORDS["social_iqa"]
    assert social_iqa_records(jsonl(SOCIAL_IQA), SOCIAL_IQA_LABELS) == HUB_RECORDS["social_iqa"]
    with pytest.raises(EvalError, match="socialiqa/dev-labels.lst is absent"):
        social_iqa_records(jsonl(SOCIAL_IQA), None)
    with pytest.raises(EvalError, match="correct='C' but socialiqa/dev-labels.lst says 2"):
        social_iqa_records(with_letters, "2\n1\n3\n")
    with pytest.raises(EvalError, match="valid values are A, B, C"):
        social_iqa_records(jsonl([{**SOCIAL_IQA[0], "correct": "D"}]), None)


def test_winogrande_reads_answers_or_the_labels_file() -> None:
    unlabelled = jsonl([{k: v for k, v in r.items() if k != "answer"} for r in WINOGRANDE])
    assert winogrande_records(unlabelled, WINOGRANDE_LABELS) == HUB_RECORDS["winogrande"]
    assert winogrande_records(jsonl(WINOGRANDE), None) == HUB_RECORDS["winogrande"]
    with pytest.raises(EvalError, match="winogrande/dev-labels.lst is absent"):
        winogrande_records(unlabelled, None)
    with pytest.raises(EvalError, match="answer 1 but winogrande/dev-labels.lst says 2"):
        winogrande_records(jsonl(WINOGRANDE), "2\n2\n2\n")
    with pytest.raises(EvalError, match="dev.jsonl has 3 records but winogrande/dev-labels.lst has 2 labels"):
        winogrande_records(unlabelled, "1\n2\n")


# -----------------------------------------------------------------------------
# Missing files


def test_missing_required_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text(jsonl(PIQA))
    with pytest.raises(EvalError, match=r"'.*piqa/valid-labels.lst' is missing \(needed for piqa\)"):
        write_local_tasks(tmp_path, tmp_path / "out")


def test_a_folder_without_any_benchmark_names_the_expected_files(tmp_path: Path) -> None:
    with pytest.raises(EvalError, match=r"No benchmark files of boolq, sciq .*boolq: boolq/dev.jsonl; sciq: sciq/test.json"):
        write_local_tasks(tmp_path, tmp_path / "out", ["sciq", "boolq"])
    with pytest.raises(EvalError, match="is not a folder"):
        write_local_tasks(tmp_path / "absent", tmp_path / "out")


def test_absent_benchmarks_are_left_to_the_hub_and_named(release_dir: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    (partial / "arc").mkdir(parents=True)
    for name in ("ARC-Easy-Test.jsonl", "ARC-Challenge-Test.jsonl"):
        (partial / "arc" / name).write_text((release_dir / "arc" / name).read_text())
    assert write_local_tasks(partial, tmp_path / "out", ["arc_easy", "boolq", "arc_challenge"]) == ["arc_challenge", "arc_easy"]
    note = data_source_note(partial, ["arc_challenge", "arc_easy"], ["boolq", "mmlu"])
    assert "supplied arc_challenge, arc_easy from local files" in note
    assert f"boolq ({partial / 'boolq' / 'dev.jsonl'}), mmlu need the hub" in note


def test_zero_shot_refuses_absent_task_files_naming_them_and_skip_missing(
    release_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt.pt"
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50304))
    torch.save({**checkpoint_state(model), "iter_num": 0, "data_meta": {"tokenizer": "gpt2"}}, ckpt)
    data = tmp_path / "data"
    (data / "sciq").mkdir(parents=True)
    (data / "sciq" / "test.json").write_text((release_dir / "sciq" / "test.json").read_text())
    (data / "piqa").mkdir()
    (data / "piqa" / "valid.jsonl").write_text(jsonl(PIQA))  # its labels file is missing
    monkeypatch.setattr(zero_shot, "make_task_manager", lambda paths: pytest.fail("the task index was built before the files were checked"))
    argv = ["--ckpt", str(ckpt), "--tasks", "sciq,boolq,piqa,arc_easy", "--local_data", str(data), "--bootstrap_iters", "0"]
    assert zero_shot.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: --local_data {str(data)!r} lacks the files of boolq ({data / 'boolq' / 'dev.jsonl'}), "
        f"piqa ({data / 'piqa' / 'valid-labels.lst'}) and arc_easy ({data / 'arc' / 'ARC-Easy-Test.jsonl'}), and nothing is "
        "fetched from the hub with --local_data; add them (layout in eval/README.md), or pass --skip_missing to leave "
        "these tasks out (marked skipped in the printed table and the results JSON)."
    )


def test_absent_task_files_go_to_the_hf_cache_when_it_holds_the_dataset(
    sciq_only: Path, tiny_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import datasets.config

    # boolq's dataset (aps/super_glue) seems to be in the cache: the folder is there, its files are not.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    (tmp_path / "hf_datasets" / "aps___super_glue").mkdir(parents=True)
    monkeypatch.setattr(zero_shot, "make_task_manager", lambda paths: fast_task_manager("super_glue/boolq")(paths))
    argv = ["--ckpt", str(tiny_ckpt), "--tasks", "sciq,boolq", "--local_data", str(sciq_only), "--bootstrap_iters", "0"]
    assert zero_shot.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after datasets' progress bars
    assert err.startswith("error: lm-eval could not load a dataset (ConnectionError: Couldn't reach 'aps/super_glue' on the Hub")
    assert f"supplied sciq from local files; boolq ({sciq_only / 'boolq' / 'dev.jsonl'}) need the hub" in err
    assert "the hub is off here (--local_data" in err and "eval.prefetch" in err


# -----------------------------------------------------------------------------
# eval/prefetch.py


def read_builtin_config(relative: str) -> dict[str, Any]:
    """A built-in task YAML with its include merged, read independently of lm-eval."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    path = BUILTIN / relative
    config = yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    if "include" in config:
        config = {**read_builtin_config(str(path.parent.relative_to(BUILTIN) / config.pop("include"))), **config}
    return config


@pytest.fixture(scope="module")
def builtin_manager() -> TaskManager:
    """lm-eval's built-in YAMLs of the paper's tasks only (indexing every task takes long)."""
    folders = sorted({str((BUILTIN / builtin).parent) for builtin, _ in BUILTIN_TASKS.values()})
    return TaskManager(include_path=folders, include_defaults=False)


def test_prefetch_loads_every_paper_task_dataset_as_lm_eval_does(builtin_manager: TaskManager, capsys: pytest.CaptureFixture) -> None:
    calls: list[tuple[str, str | None, dict]] = []

    def fake_load(path: str, name: str | None = None, **kwargs: Any) -> dict[str, list]:
        calls.append((path, name, kwargs))
        return {"train": [1, 2], "validation": [1], "test": [1, 2, 3]}

    specs = prefetch.dataset_specs(zero_shot.split_task_list("paper"), builtin_manager)
    fetched = prefetch.prefetch(specs, load=fake_load)
    expected = {}
    for task, (builtin, split) in BUILTIN_TASKS.items():
        config = read_builtin_config(builtin)
        expected[task] = (config["dataset_path"], config.get("dataset_name"))
        spec = next(s for s in specs if s.task == task)
        assert (spec.path, spec.name) == expected[task]
        assert spec.eval_split == split and split in spec.splits
        assert set(fetched[task]) == {"train", "validation", "test"}
    # Each distinct dataset is loaded once, with lm-eval's arguments.
    assert sorted((path, name) for path, name, _ in calls) == sorted(set(expected.values()))
    assert all(kwargs == {} for _, _, kwargs in calls)  # the paper's tasks set no dataset_kwargs
    assert "arc_challenge: allenai/ai2_arc (ARC-Challenge): train 2, validation 1, test 3 (evaluates test)" in capsys.readouterr().out


def test_prefetch_refuses_a_dataset_without_the_split_a_task_reads(builtin_manager: TaskManager) -> None:
    specs = prefetch.dataset_specs(["boolq"], builtin_manager)
    with pytest.raises(EvalError, match="has no split validation that task boolq reads; it has train"):
        prefetch.prefetch(specs, load=lambda **kwargs: {"train": [1]}, log=lambda line: None)


def test_prefetch_offline_is_one_clear_error() -> None:
    import datasets

    spec = prefetch.DatasetSpec("hub_only", "spheretnorm-tests/never-downloaded", None, {}, ("test",), "test")
    with pytest.raises(EvalError, match=r"Could not fetch spheretnorm-tests/never-downloaded for task hub_only .*HF_DATASETS_OFFLINE and HF_HUB_OFFLINE are set.*machine with internet"):
        prefetch.prefetch([spec], load=datasets.load_dataset, log=lambda line: None)


def test_prefetch_without_network_says_the_hub_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def no_network(**kwargs: Any) -> None:
        raise ConnectionError("Couldn't reach 'allenai/sciq' on the Hub (ConnectionError)")

    spec = prefetch.DatasetSpec("sciq", "allenai/sciq", None, {}, ("test",), "test")
    with pytest.raises(EvalError, match="the Hugging Face hub could not be reached; run `python -m eval.prefetch` on a machine with internet"):
        prefetch.prefetch([spec], load=no_network, log=lambda line: None)


def test_prefetch_cli_reports_an_unknown_task(monkeypatch: pytest.MonkeyPatch, builtin_manager: TaskManager, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(prefetch, "make_task_manager", lambda paths: builtin_manager)
    assert prefetch.main(["--tasks", "sciq,hellaswagg"]) == 2
    assert capsys.readouterr().err.strip() == "error: Unknown task 'hellaswagg' (did you mean hellaswag?); `python -m eval.lm_eval_cli ls tasks` lists the known tasks."


# -----------------------------------------------------------------------------
# --skip_missing, and lm-eval's own CLI with --local_data


@pytest.fixture
def tiny_ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50304))
    path = tmp_path / "ckpt.pt"
    torch.save({**checkpoint_state(model), "iter_num": 0, "data_meta": {"tokenizer": "gpt2"}}, path)
    return path


@pytest.fixture
def sciq_only(release_dir: Path, tmp_path: Path) -> Path:
    """A --local_data folder with SciQ's file and no other benchmark's."""
    data = tmp_path / "data"
    (data / "sciq").mkdir(parents=True)
    (data / "sciq" / "test.json").write_text((release_dir / "sciq" / "test.json").read_text())
    return data


def fast_task_manager(*builtin: str) -> Any:
    """lm-eval's TaskManager indexing only the given built-in folders and the include paths (the full index takes long)."""

    def make(include_path: Any = None, **kwargs: Any) -> TaskManager:
        paths = include_path if isinstance(include_path, list) else [include_path] if include_path else []
        return TaskManager(include_path=[*(str(BUILTIN / b) for b in builtin), *paths], include_defaults=False, **kwargs)

    return make


def test_skip_missing_leaves_out_absent_tasks_and_says_so(
    sciq_only: Path, tiny_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(zero_shot, "make_task_manager", lambda paths: fast_task_manager()(paths))
    out = tmp_path / "results.json"
    argv = ["--ckpt", str(tiny_ckpt), "--tasks", "sciq,boolq", "--local_data", str(sciq_only), "--bootstrap_iters", "0", "--out", str(out)]
    assert zero_shot.main([*argv, "--skip_missing"]) == 0
    results = json.loads(out.read_text())
    assert set(results["results"]) == {"sciq"}
    assert results["skipped"] == {"boolq": f"files absent under --local_data: {sciq_only / 'boolq' / 'dev.jsonl'}"}
    assert results["paper_table"]["sciq/acc"] is not None and results["paper_table"]["boolq/acc"] is None
    assert zero_shot.incomplete_reason(results) == "tasks skipped for lack of their files: boolq"
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if "| ARC-C |" in line)  # the paper's table
    cells = dict(zip(*([c.strip() for c in lines[i].strip("|").split("|")] for i in (header, header + 2))))
    assert cells["BoolQ"] == "skipped" and cells["ARC-C"] == "-" and float(cells["SciQ"]) >= 0
    assert f"SKIPPED: boolq (files absent under --local_data: {sciq_only / 'boolq' / 'dev.jsonl'}); not a complete paper evaluation." in printed
    # Without the flag, boolq's absent file is refused before anything else, in one line naming the file and the flag.
    assert zero_shot.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --local_data {str(sciq_only)!r} lacks the files of boolq ({sciq_only / 'boolq' / 'dev.jsonl'})")
    assert "pass --skip_missing to leave this task out" in err and "\n" not in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tasks", "boolq,piqa", "--skip_missing"], r"Every requested task lacks its files under .*boolq: boolq/dev.jsonl; piqa: piqa/valid.jsonl, piqa/valid-labels.lst"),
        (["--tasks", "sciq", "--skip_missing", "--local_data", ""], r"--skip_missing leaves out tasks whose files are absent under --local_data DIR; give --local_data too"),
    ],
    ids=["every task's files absent", "without --local_data"],
)
def test_skip_missing_refuses_what_leaves_nothing_to_do(
    sciq_only: Path, tiny_ckpt: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert zero_shot.main(["--ckpt", str(tiny_ckpt), "--local_data", str(sciq_only), *extra]) == 2
    assert re.fullmatch(f"error: {message}.*", capsys.readouterr().err.strip())


def test_lm_eval_cli_scores_local_data_offline(
    sciq_only: Path, tiny_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", fast_task_manager())  # what lm-eval's CLI builds
    out = tmp_path / "out"
    argv = ["run", "--model", "nanogpt", "--model_args", f"ckpt={tiny_ckpt},device=cpu", "--tasks", "sciq,boolq", "--limit", "2"]
    assert lm_eval_cli.main([*argv, "--output_path", str(out), "--local_data", str(sciq_only), "--skip_missing"]) == 0
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert set(results["results"]) == {"sciq"} and results["n-samples"]["sciq"]["effective"] == 2
    assert results["configs"]["sciq"]["dataset_path"] == "json"  # read from the release file, not the hub
    assert f"skipped: boolq (files absent under --local_data: {sciq_only / 'boolq' / 'dev.jsonl'})" in capsys.readouterr().err
    # Without --skip_missing, boolq's absent file is refused before lm-eval starts: one line, no traceback.
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda *a, **k: pytest.fail("lm-eval started before the files were checked"))
    assert lm_eval_cli.main([*argv, "--local_data", str(sciq_only)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --local_data {str(sciq_only)!r} lacks the files of boolq ({sciq_only / 'boolq' / 'dev.jsonl'})")
    assert "--skip_missing" in err and "\n" not in err
