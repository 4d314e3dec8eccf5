"""Offline copies of the paper's 11 zero-shot benchmarks as lm-eval tasks, from their original files.

    python eval/zero_shot.py --ckpt out/ckpt.pt --tasks paper --local_data DIR

``write_local_tasks(data_dir, out_dir)`` converts each benchmark found under data_dir into the
records of the hub dataset that lm-eval's built-in task reads, and writes them as jsonl with one
task YAML per benchmark. Each YAML *includes* lm-eval's own YAML, so prompt, target, metrics and
``process_docs`` stay lm-eval's and only the data source changes; the tasks keep the built-in
names, so with out_dir on lm-eval's include path they replace the hub versions.
``prepare_local_tasks`` adds what the commands need: every requested task's files are checked
before anything is read, and --skip_missing. eval/README.md documents the layout of data_dir
(``LOCAL_TASK_SPECS`` below is its source), the record fields each benchmark needs, and what is
refused. Each task reads the split its built-in task evaluates (the released dev file for validation).

WikiText-2 is split into documents at its top-level ``= Title =`` headings (62 articles),
approximating the hub's EleutherAI/wikitext_document_level; word perplexity can differ from
the hub version in the last digits if that dataset's whitespace differs.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from spheretnorm.zeroshot import errors
from spheretnorm.zeroshot.errors import EvalError, Schema, empty_field, kind_of, parse_json, problem_sentence, schema_problem, schema_text

Record = dict[str, Any]

LAMBADA_FILE = "lambada_openai/lambada_test.jsonl"
WIKITEXT_FILE = "wikitext2/wiki.test.raw"
PIQA_FILE = "piqa/valid.jsonl"
PIQA_LABELS_FILE = "piqa/valid-labels.lst"
ARC_CHALLENGE_FILE = "arc/ARC-Challenge-Test.jsonl"
ARC_EASY_FILE = "arc/ARC-Easy-Test.jsonl"
OPENBOOKQA_FILE = "openbookqa/test.jsonl"
BOOLQ_FILE = "boolq/dev.jsonl"
SOCIAL_IQA_FILE = "socialiqa/dev.jsonl"
SOCIAL_IQA_LABELS_FILE = "socialiqa/dev-labels.lst"
WINOGRANDE_FILE = "winogrande/dev.jsonl"
WINOGRANDE_LABELS_FILE = "winogrande/dev-labels.lst"
HELLASWAG_FILE = "hellaswag/hellaswag_val.jsonl"
SCIQ_FILE = "sciq/test.json"

# A top-level WikiText heading line: " = Title = " (sections are " = = Title = = ").
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")

LAYOUT_DOC = "eval/README.md"  # where users read the layout; every error about the files points there


def _name(data_dir: str | Path, relative: str) -> str:
    """How errors name a benchmark file: its path under data_dir ('' keeps the relative name)."""
    return str(Path(data_dir) / relative)


# -----------------------------------------------------------------------------
# The fields of each benchmark's release records (schemas as in spheretnorm/zeroshot/errors.py)
#
# Each record is checked before any conversion: lm-eval would otherwise meet a renamed or null
# field deep inside its prompt templates, as a traceback far from the file that caused it.

PIQA_FIELDS: Schema = {"goal": str, "sol1": str, "sol2": str}
LAMBADA_FIELDS: Schema = {"text": str}
ARC_FIELDS: Schema = {"id": str, "question": {"stem": str, "choices": [{"text": str, "label": str}]}, "answerKey": str}
BOOLQ_FIELDS: Schema = {"question": str, "passage": str, "answer": bool}
SOCIAL_IQA_FIELDS: Schema = {"context": str, "question": str, "answerA": str, "answerB": str, "answerC": str}
WINOGRANDE_FIELDS: Schema = {"sentence": str, "option1": str, "option2": str}
# The fields of the hub's Rowan/hellaswag, in its order; label is a string there.
HELLASWAG_FIELDS = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split", "split_type", "label")
HELLASWAG_SCHEMA: Schema = {**{k: str for k in HELLASWAG_FIELDS}, "ind": int, "endings": [str], "label": (int, str)}
SCIQ_FIELDS = ("question", "distractor3", "distractor1", "distractor2", "correct_answer", "support")
SCIQ_SCHEMA: Schema = {k: str for k in SCIQ_FIELDS}


# Text fields that the releases themselves leave empty in some records (SciQ's support, HellaSwag's
# ctx_b, ...); every other text field of a record must hold text.
MAY_BE_EMPTY = frozenset({"support", "ctx_a", "ctx_b", "title", "activity_label", "source_id", "split", "split_type", "id", "qID"})


def check_records(records: list[Any], schema: Schema, source: str, lines: list[int] | None = None) -> list[Record]:
    """The records, each checked against schema; the first bad one is an EvalError naming it (and its line, for jsonl)."""
    for index, record in enumerate(records):
        subject = f"Record {index + 1} of {source}" + (f" (line {lines[index]})" if lines else "")
        problem = schema_problem(record, schema)
        fields = schema_text(schema)
        need = f"its records need the fields {fields}" if fields else "each record must be a JSON object"
        if problem:
            raise EvalError(f"{problem_sentence(subject, problem)}; {need} (see {LAYOUT_DOC}).")
        empty = empty_field(record, schema, MAY_BE_EMPTY)
        if empty:
            raise EvalError(f"{subject}: {empty} is empty; {need}, with text in {empty} (see {LAYOUT_DOC}).")
    return records


# -----------------------------------------------------------------------------
# Reading the original files


def read_jsonl(text: str, source: str, schema: Schema | None = None) -> list[Record]:
    """The JSON objects of a jsonl text, one per non-empty line, checked against schema when given.

    A bad line names its number; source is the file's name in errors.
    """
    records, lines = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(parse_json(line))
        except json.JSONDecodeError as exc:
            raise EvalError(f"Line {number} of {source} is not valid JSON ({exc.msg}); expected one JSON object per line.") from None
        except ValueError as exc:  # nested too deeply
            raise EvalError(f"Line {number} of {source} {exc}; expected one flat JSON object per line (see {LAYOUT_DOC}).") from None
        lines.append(number)
    return check_records(records, schema if schema is not None else {}, source, lines)


def read_labels(text: str, valid: tuple[str, ...], source: str) -> list[str]:
    """One label per line of a .lst file, each one of `valid`."""
    labels = text.split()
    bad = sorted({l for l in labels if l not in valid})
    if bad:
        raise EvalError(f"{source} has labels {', '.join(bad)}; valid labels are {', '.join(valid)}.")
    return labels


def _check_same_length(records: list[Record], labels: list[str], records_file: str, labels_file: str) -> None:
    if len(records) != len(labels):
        raise EvalError(f"{records_file} has {len(records)} records but {labels_file} has {len(labels)} labels; the two files do not match.")


# -----------------------------------------------------------------------------
# Conversions: original release record -> the hub dataset's record that lm-eval's task reads


def wikitext_documents(raw: str) -> list[str]:
    """Split WikiText raw text into articles, each starting at its title line."""
    docs: list[str] = []
    current: list[str] = []
    for line in raw.split("\n"):
        if _WIKITEXT_TITLE.match(line):
            if any(l.strip() for l in current):
                docs.append("\n".join(current))
            current = []  # blank lines before the first title belong to no article
        current.append(line)
    if any(l.strip() for l in current):
        docs.append("\n".join(current))
    return docs


def piqa_records(questions_jsonl: str, labels_lst: str, data_dir: str | Path = "") -> list[Record]:
    """PIQA items with their label merged in, the fields lm-eval's piqa task reads.

    data_dir only names the files in errors.
    """
    questions_file, labels_file = _name(data_dir, PIQA_FILE), _name(data_dir, PIQA_LABELS_FILE)
    questions = read_jsonl(questions_jsonl, questions_file, PIQA_FIELDS)
    labels = [int(label) for label in read_labels(labels_lst, ("0", "1"), labels_file)]
    _check_same_length(questions, [str(l) for l in labels], questions_file, labels_file)
    return [{**q, "label": label} for q, label in zip(questions, labels)]


def arc_record(original: Record) -> Record:
    """ARC release -> allenai/ai2_arc: the stem becomes `question`, choices become two lists.

    answerKey stays as released: a few items use '1'-'4' instead of 'A'-'E', and so does the hub.
    """
    choices = original["question"]["choices"]
    return {
        "id": original["id"],
        "question": original["question"]["stem"],
        "choices": {"text": [c["text"] for c in choices], "label": [c["label"] for c in choices]},
        "answerKey": original["answerKey"],
    }


def openbookqa_record(original: Record) -> Record:
    """OpenBookQA release (Main/test.jsonl) -> allenai/openbookqa 'main': the stem is `question_stem`."""
    record = arc_record(original)
    return {"id": record["id"], "question_stem": record["question"], "choices": record["choices"], "answerKey": record["answerKey"]}


def boolq_record(original: Record, idx: int) -> Record:
    """BoolQ release -> super_glue boolq: answer true/false becomes label 1/0, idx the line number."""
    return {
        "question": original["question"],
        "passage": original["passage"],
        "idx": idx,
        "label": int(bool(original["answer"])),
    }


SOCIAL_IQA_LETTERS = {"A": "1", "B": "2", "C": "3"}


def _labelled_records(
    dev_jsonl: str,
    labels_lst: str | None,
    names: tuple[str, str],
    fields: Schema,
    valid_labels: tuple[str, ...],
    label_key: str,
    label_of: Callable[[Record, str | None, int, tuple[str, str]], str],
) -> list[Record]:
    """Records of a release whose labels come from each record or from a separate .lst file
    (Social IQa, WinoGrande): the hub's fields plus label_key, from label_of."""
    originals = read_jsonl(dev_jsonl, names[0], fields)
    labels = read_labels(labels_lst, valid_labels, names[1]) if labels_lst is not None else None
    if labels is not None:
        _check_same_length(originals, labels, *names)
    return [
        {**{k: original[k] for k in fields}, label_key: label_of(original, labels[i] if labels is not None else None, i, names)}
        for i, original in enumerate(originals)
    ]


def social_iqa_records(dev_jsonl: str, labels_lst: str | None, data_dir: str | Path = "") -> list[Record]:
    """Social IQa release -> the hub's social_i_qa: label '1'-'3' from `correct` (A-C) or the .lst.

    data_dir only names the files in errors.
    """
    names = (_name(data_dir, SOCIAL_IQA_FILE), _name(data_dir, SOCIAL_IQA_LABELS_FILE))
    return _labelled_records(dev_jsonl, labels_lst, names, SOCIAL_IQA_FIELDS, ("1", "2", "3"), "label", _social_iqa_label)


def _social_iqa_label(original: Record, from_lst: str | None, index: int, names: tuple[str, str]) -> str:
    """The hub label of one item; `correct` and the .lst must agree where both are given."""
    correct = original.get("correct")
    records_file, labels_file = names
    if correct is None and from_lst is None:
        raise EvalError(
            f"Record {index + 1} of {records_file} has no 'correct' answer and {labels_file} is absent; "
            "give the labels file or records with 'correct'."
        )
    if correct is None:
        return from_lst  # type: ignore[return-value]
    if not isinstance(correct, str) or correct not in SOCIAL_IQA_LETTERS:
        raise EvalError(f"Record {index + 1} of {records_file} has correct={correct!r}; valid values are A, B, C.")
    label = SOCIAL_IQA_LETTERS[correct]
    if from_lst is not None and from_lst != label:
        raise EvalError(f"Record {index + 1} of {records_file} has correct={correct!r} but {labels_file} says {from_lst}.")
    return label


def winogrande_records(dev_jsonl: str, labels_lst: str | None, data_dir: str | Path = "") -> list[Record]:
    """WinoGrande release -> the hub's winogrande: answer '1'/'2' (a string), from the record or the .lst.

    data_dir only names the files in errors.
    """
    names = (_name(data_dir, WINOGRANDE_FILE), _name(data_dir, WINOGRANDE_LABELS_FILE))
    return _labelled_records(dev_jsonl, labels_lst, names, WINOGRANDE_FIELDS, ("1", "2"), "answer", _winogrande_answer)


def _winogrande_answer(original: Record, from_lst: str | None, index: int, names: tuple[str, str]) -> str:
    """The hub answer of one item; the record's answer and the .lst must agree where both are given."""
    answer = original.get("answer")
    records_file, labels_file = names
    if answer in (None, ""):  # the release's unlabelled files have no (or an empty) answer
        if from_lst is None:
            raise EvalError(
                f"Record {index + 1} of {records_file} has no answer and {labels_file} is absent; "
                "give the labels file or records with 'answer'."
            )
        return from_lst
    answer = str(answer)
    if answer not in ("1", "2"):
        raise EvalError(f"Record {index + 1} of {records_file} has answer={answer!r}; valid answers are 1, 2.")
    if from_lst is not None and from_lst != answer:
        raise EvalError(f"Record {index + 1} of {records_file} has answer {answer} but {labels_file} says {from_lst}.")
    return answer


def lambada_records(text: str, source: str) -> list[Record]:
    """LAMBADA's passages as released, checked. lm-eval predicts a passage's last word from the
    words before it, so a one-word passage is scored with no context at all: the release has
    none, so such records are counted in one warning line (and scored as lm-eval scores them)."""
    records = read_jsonl(text, source, LAMBADA_FIELDS)
    short = [index + 1 for index, record in enumerate(records) if len(record["text"].split()) < 2]
    if short:
        print(f"warning: {len(short)} of the {len(records)} records of {source} hold a single word (record {short[0]} the first), "
              "which LAMBADA scores with no context to predict it from; the LAMBADA release has none, so check the file.", file=sys.stderr)
    return records


def hellaswag_record(original: Record) -> Record:
    """HellaSwag release -> Rowan/hellaswag: the same fields, label as a string ('0'-'3').

    lm-eval's process_docs (query from activity_label, ctx_a, ctx_b; cleaned endings) then runs
    on these records as on the hub's.
    """
    record = {k: original[k] for k in HELLASWAG_FIELDS}
    record["label"] = str(record["label"])
    return record


def sciq_record(original: Record) -> Record:
    """SciQ release -> allenai/sciq: the same six fields."""
    return {k: original[k] for k in SCIQ_FIELDS}


# -----------------------------------------------------------------------------
# One spec per benchmark

Texts = dict[str, str | None]  # {relative path: text, or None for an absent optional file}


@dataclass(frozen=True)
class LocalTask:
    """How one benchmark is read from data_dir and which built-in lm-eval task it stands in for."""

    name: str
    builtin_yaml: str  # lm-eval's own YAML, relative to the lm_eval/tasks folder
    split: str  # the split the built-in task evaluates: "test" or "validation"
    files: tuple[str, ...]  # under data_dir; the task is local when any of them is there
    optional: tuple[str, ...]  # files read when present (labels the records may carry themselves)
    convert: Callable[[Texts, Path], list[Record]]  # ({relative path: text}, data_dir) -> hub records


def _map_jsonl(path: str, schema: Schema, record: Callable[[Record], Record]) -> Callable[[Texts, Path], list[Record]]:
    """The conversion of a benchmark stored as one jsonl file whose records convert one by one."""

    def convert(texts: Texts, data_dir: Path) -> list[Record]:
        return [record(r) for r in read_jsonl(texts[path] or "", _name(data_dir, path), schema)]

    return convert


def _boolq(texts: Texts, data_dir: Path) -> list[Record]:
    originals = read_jsonl(texts[BOOLQ_FILE] or "", _name(data_dir, BOOLQ_FILE), BOOLQ_FIELDS)
    return [boolq_record(r, i) for i, r in enumerate(originals)]


def _sciq(texts: Texts, data_dir: Path) -> list[Record]:
    source = _name(data_dir, SCIQ_FILE)
    try:
        originals = parse_json(texts[SCIQ_FILE] or "")
    except json.JSONDecodeError as exc:
        raise EvalError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno}); the SciQ release stores each split as one JSON array.") from None
    except ValueError as exc:  # nested too deeply
        raise EvalError(f"{source} {exc}; the SciQ release stores each split as one JSON array of flat records.") from None
    if not isinstance(originals, list):
        raise EvalError(f"{source} holds {kind_of(originals)}; the SciQ release stores each split as one JSON array.")
    return [sciq_record(r) for r in check_records(originals, SCIQ_SCHEMA, source)]


LOCAL_TASK_SPECS = (
    LocalTask("lambada_openai", "lambada/lambada_openai.yaml", "test", (LAMBADA_FILE,), (),
              lambda t, d: lambada_records(t[LAMBADA_FILE] or "", _name(d, LAMBADA_FILE))),
    LocalTask("wikitext", "wikitext/wikitext.yaml", "test", (WIKITEXT_FILE,), (),
              lambda t, d: [{"page": doc} for doc in wikitext_documents(t[WIKITEXT_FILE] or "")]),
    LocalTask("piqa", "piqa/piqa.yaml", "validation", (PIQA_FILE, PIQA_LABELS_FILE), (),
              lambda t, d: piqa_records(t[PIQA_FILE] or "", t[PIQA_LABELS_FILE] or "", d)),
    LocalTask("arc_challenge", "arc/arc_challenge.yaml", "test", (ARC_CHALLENGE_FILE,), (), _map_jsonl(ARC_CHALLENGE_FILE, ARC_FIELDS, arc_record)),
    LocalTask("arc_easy", "arc/arc_easy.yaml", "test", (ARC_EASY_FILE,), (), _map_jsonl(ARC_EASY_FILE, ARC_FIELDS, arc_record)),
    LocalTask("openbookqa", "openbookqa/openbookqa.yaml", "test", (OPENBOOKQA_FILE,), (), _map_jsonl(OPENBOOKQA_FILE, ARC_FIELDS, openbookqa_record)),
    LocalTask("boolq", "super_glue/boolq/default.yaml", "validation", (BOOLQ_FILE,), (), _boolq),
    LocalTask("social_iqa", "siqa/siqa.yaml", "validation", (SOCIAL_IQA_FILE,), (SOCIAL_IQA_LABELS_FILE,),
              lambda t, d: social_iqa_records(t[SOCIAL_IQA_FILE] or "", t[SOCIAL_IQA_LABELS_FILE], d)),
    LocalTask("winogrande", "winogrande/default.yaml", "validation", (WINOGRANDE_FILE,), (WINOGRANDE_LABELS_FILE,),
              lambda t, d: winogrande_records(t[WINOGRANDE_FILE] or "", t[WINOGRANDE_LABELS_FILE], d)),
    LocalTask("hellaswag", "hellaswag/hellaswag.yaml", "validation", (HELLASWAG_FILE,), (), _map_jsonl(HELLASWAG_FILE, HELLASWAG_SCHEMA, hellaswag_record)),
    LocalTask("sciq", "sciq/sciq.yaml", "test", (SCIQ_FILE,), (), _sciq),
)
LOCAL_TASKS = tuple(spec.name for spec in LOCAL_TASK_SPECS)
_SPECS = {spec.name: spec for spec in LOCAL_TASK_SPECS}


def local_task_spec(name: str) -> LocalTask:
    if name not in _SPECS:
        raise EvalError(f"No local version of task {name!r}; tasks with one are: {', '.join(LOCAL_TASKS)}.")
    return _SPECS[name]


# -----------------------------------------------------------------------------
# Finding and reading the files


def expected_paths(data_dir: str | Path, task: str) -> list[Path]:
    """The files under data_dir that a task's local version reads (optional ones left out)."""
    return [Path(data_dir) / f for f in local_task_spec(task).files]


def missing_files(data_dir: str | Path, tasks: list[str] | tuple[str, ...]) -> dict[str, list[Path]]:
    """{task: its required files absent under data_dir}, for those of `tasks` with a local version that lack any."""
    missing = {t: [p for p in expected_paths(data_dir, t) if not p.is_file()] for t in tasks if t in _SPECS}
    return {t: paths for t, paths in missing.items() if paths}


def read_text_file(path: Path) -> str:
    """A benchmark file's text; binary content or an unreadable file is one EvalError naming it."""
    try:
        return errors.read_text_file(path)
    except errors.UnreadableFile as exc:
        raise EvalError(f"Local benchmark file {str(path)!r} {exc}; expected the release's text file, laid out as {LAYOUT_DOC} says.") from None


def _read_files(data_dir: Path, spec: LocalTask) -> Texts:
    """{relative path: text} of the task's files; a missing required file is one clear error."""
    texts: Texts = {}
    for relative in spec.files:
        path = data_dir / relative
        if not path.is_file():
            raise EvalError(
                f"Local benchmark file {str(path)!r} is missing (needed for {spec.name}); "
                f"see {LAYOUT_DOC} for the expected layout, or pass --skip_missing to leave the task out."
            )
        texts[relative] = read_text_file(path)
    for relative in spec.optional:
        path = data_dir / relative
        texts[relative] = read_text_file(path) if path.is_file() else None
    return texts


def convert_task(data_dir: str | Path, task: str) -> list[Record]:
    """A task's records from its original files under data_dir, in the hub dataset's schema."""
    spec = local_task_spec(task)
    records = spec.convert(_read_files(Path(data_dir), spec), Path(data_dir))
    if not records:
        raise EvalError(f"The local files of {task} under {str(data_dir)!r} hold no records.")
    return records


# -----------------------------------------------------------------------------
# Writing the task YAMLs


def _builtin_yaml(spec: LocalTask) -> Path:
    import lm_eval.tasks  # here, not at the top: the commands set the offline variables first

    path = Path(lm_eval.tasks.__file__).parent / spec.builtin_yaml
    if not path.is_file():
        raise EvalError(f"This lm-eval version has no built-in {spec.name} task at {path}, which the local copy includes.")
    return path


def task_yaml(spec: LocalTask, data_file: Path) -> dict[str, Any]:
    """The built-in task with its data read from one local json file."""
    return {
        "include": str(_builtin_yaml(spec)),
        "task": spec.name,
        "tag": [],  # don't let the local copy replace a built-in tag (e.g. "ai2_arc") with itself
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {spec.split: str(data_file.resolve())}},
        "training_split": None,
        "validation_split": spec.split if spec.split == "validation" else None,
        "test_split": spec.split if spec.split == "test" else None,
    }


def _layout_hint(tasks: list[str]) -> str:
    return "; ".join(f"{t}: {', '.join(local_task_spec(t).files)}" for t in tasks)


def _check_data_dir(data_dir: Path) -> None:
    if not data_dir.is_dir():
        raise EvalError(f"--local_data {str(data_dir)!r} is not a folder; it should hold the benchmark files laid out as {LAYOUT_DOC} says.")


def write_local_tasks(data_dir: str | Path, out_dir: str | Path, tasks: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Write lm-eval task YAMLs for those of `tasks` (default: all 11) whose files are under data_dir.

    A task none of whose files is there is skipped (it stays with the hub / HF cache); a task with
    some of its files is read, and a missing required file is an EvalError naming its path. At
    least one task must be found. Returns the names written, in LOCAL_TASKS order; pass out_dir as
    lm-eval's include_path (TaskManager(include_path=...)).
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    _check_data_dir(data_dir)
    wanted = [t for t in LOCAL_TASKS if tasks is None or t in tasks]
    present = [t for t in wanted if any((data_dir / f).is_file() for f in _SPECS[t].files)]  # then all required ones must be
    if wanted and not present:
        raise EvalError(f"No benchmark files of {', '.join(wanted)} under {str(data_dir)!r}; expected {_layout_hint(wanted)}.")
    out_dir.mkdir(parents=True, exist_ok=True)
    for task in present:
        spec = _SPECS[task]
        data_file = out_dir / f"{task}_{spec.split}.jsonl"
        data_file.write_text("".join(json.dumps(r) + "\n" for r in convert_task(data_dir, task)), encoding="utf-8")
        config = task_yaml(spec, data_file)
        (out_dir / f"local_{task}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return present


def data_source_note(data_dir: str | Path, local: list[str], hub: list[str]) -> str:
    """Which tasks --local_data supplied and which need the hub, with the files that were absent."""
    absent = [f"{t} ({', '.join(str(p) for p in expected_paths(data_dir, t))})" if t in _SPECS else t for t in hub]
    skippable = " (or --skip_missing to leave them out)" if any(t in _SPECS for t in hub) else ""
    return (
        f"--local_data {str(data_dir)!r} supplied {', '.join(local) or 'no task'} from local files; "
        f"{', '.join(absent)} need the hub or a filled HF cache{skippable}, since their files are absent"
    )


# -----------------------------------------------------------------------------
# What the commands do with --local_data and --skip_missing


@dataclass(frozen=True)
class LocalPlan:
    """Where each requested task's data comes from."""

    local: list[str]  # read from the release files under data_dir
    skipped: dict[str, str]  # task -> why it is not evaluated (--skip_missing)
    source_note: str  # for the error when a hub task cannot be loaded ("" when none needs the hub)


def check_skip_missing(local_data: str | Path | None, skip_missing: bool) -> None:
    """--skip_missing only means something with --local_data: refuse it alone rather than ignore it."""
    if skip_missing and not local_data:
        raise EvalError("--skip_missing leaves out tasks whose files are absent under --local_data DIR; give --local_data too.")


def cached_in_hf(task: str) -> bool:
    """Whether the HF cache holds the hub dataset of the built-in task that a local task stands in for."""
    from lm_eval.tasks._yaml_loader import load_yaml

    from spheretnorm.zeroshot.offline import uncached_hub_dataset

    try:
        config = load_yaml(str(_builtin_yaml(_SPECS[task])), resolve_func=False)
    except (EvalError, OSError, yaml.YAMLError):
        return False
    return isinstance(config, dict) and uncached_hub_dataset(config) is None and bool(config.get("dataset_path"))


def _absent_text(absent: dict[str, list[Path]]) -> str:
    """'boolq (D/boolq/dev.jsonl) and piqa (D/piqa/valid.jsonl, D/piqa/valid-labels.lst)'."""
    items = [f"{t} ({', '.join(str(p) for p in paths)})" for t, paths in absent.items()]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def check_local_files(data_dir: str | Path, tasks: list[str] | tuple[str, ...]) -> list[str]:
    """Refuse, in one EvalError, the requested tasks with a local version that lack any of their files
    under data_dir; returns those whose files are all absent but whose hub dataset is in the HF
    cache (they are read from there, offline).

    With --local_data nothing is fetched from the hub, so this runs before anything else: a task
    whose files are missing would otherwise end in a dataset that cannot be loaded, after the
    task index and the model.
    """
    data_dir = Path(data_dir)
    absent = missing_files(data_dir, tasks)
    from_cache = [t for t, paths in absent.items() if len(paths) == len(_SPECS[t].files) and cached_in_hf(t)]
    refused = {t: paths for t, paths in absent.items() if t not in from_cache}
    if refused:
        raise EvalError(
            f"--local_data {str(data_dir)!r} lacks the files of {_absent_text(refused)}, and nothing is fetched "
            f"from the hub with --local_data; add them (layout in {LAYOUT_DOC}), or pass --skip_missing to leave "
            f"{'this task' if len(refused) == 1 else 'these tasks'} out (marked skipped in the printed table and the results JSON)."
        )
    return from_cache


def prepare_local_tasks(
    data_dir: str | Path, out_dir: str | Path, tasks: list[str], skip_missing: bool = False, require_files: bool = True
) -> LocalPlan:
    """Write the local task YAMLs of `tasks` into out_dir (an include path for lm-eval) and say where each task's data comes from.

    Every task's files are checked first (check_local_files): a task that has a local version
    but lacks any of its files is refused, unless its dataset is in the HF cache. With
    skip_missing it is left out instead (with the reason); if that leaves nothing to evaluate, it
    is an EvalError naming the expected files. require_files=False (lm-eval's `ls`, which loads
    no dataset) writes the tasks that are there and leaves the others be.
    """
    data_dir = Path(data_dir)
    _check_data_dir(data_dir)
    skipped: dict[str, str] = {}
    if skip_missing:
        absent = missing_files(data_dir, tasks)
        skipped = {t: f"files absent under --local_data: {', '.join(map(str, paths))}" for t, paths in absent.items()}
        if skipped and all(t in skipped for t in tasks):
            raise EvalError(f"Every requested task lacks its files under {str(data_dir)!r}, so nothing is left to evaluate; expected {_layout_hint(list(skipped))}.")
    elif require_files:
        check_local_files(data_dir, tasks)
    kept = [t for t in tasks if t not in skipped]
    local = write_local_tasks(data_dir, out_dir, kept)
    hub = [t for t in kept if t not in local]
    return LocalPlan(local, skipped, data_source_note(data_dir, local, hub) if hub else "")
