"""sbatch's command lines: a run's training job (scripts/slurm_train.sh) or its zero-shot job, what
reaches each job (--export), the dependency that chains an evaluation to its training; and the
options of --sbatch_args, read as sbatch reads them and checked before anything is submitted.
"""

from __future__ import annotations

import os
import shlex

from spheretnorm.cluster.grid_runs import GridRun, Layout, job_name
from spheretnorm.runtime.cli import UsageError

SLURM_SCRIPT = "scripts/slurm_train.sh"
# Set on the submitting machine, these reach every job by name (an air-gapped cluster's settings).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE")


def export_option(extra: list[str], env: dict[str, str] | None = None) -> str:
    """--export=ALL plus `extra` and the offline variables set in `env`, by name: they reach the
    job even where the cluster's sbatch would not pass the submitting environment on."""
    env = os.environ if env is None else env
    # A value with a comma cannot be written in --export; ALL still carries it.
    offline = [f"{k}={env[k]}" for k in OFFLINE_VARIABLES if env.get(k) and "," not in env[k]]
    return "--export=" + ",".join(["ALL", *extra, *offline])


def sbatch_command(run: GridRun, layout: Layout, wrapped: list[str] | None = None) -> list[str]:
    """sbatch of scripts/slurm_train.sh for training, or of `wrapped` (one GPU) for evaluation.

    layout.sbatch_args (partition, account, QOS, time limit, ...) go to sbatch as they are; what
    they leave out comes from SLURM's own SBATCH_* variables, then from the script's defaults.
    """
    options = [
        "sbatch",
        f"--job-name={job_name(run, 'train' if wrapped is None else 'zero_shot')}",
        f"--output={run.out_dir}/slurm-%x-%j.out",
        *layout.sbatch_args,
    ]
    if wrapped is not None:
        return [*options, "--nodes=1", "--gpus-per-node=1", export_option([]), f"--wrap={shlex.join(wrapped)}"]
    return [
        *options,
        f"--nodes={layout.nnodes}",
        f"--gpus-per-node={layout.nproc_per_node}",
        export_option([f"GPUS_PER_NODE={layout.nproc_per_node}"]),
        SLURM_SCRIPT,
        *run.args(),
    ]


def with_dependency(command: list[str], job_id: str) -> list[str]:
    """An sbatch command that starts only once job `job_id` has ended with exit status 0."""
    return [command[0], f"--dependency=afterok:{job_id}", *command[1:]]


# sbatch's short options and their long names: those that take a value, and those that do not
# (-I and -k take an optional value, attached only).
SBATCH_SHORT_VALUES = {
    "A": "account", "a": "array", "b": "begin", "C": "constraint", "c": "cpus-per-task", "D": "chdir",
    "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus", "i": "input", "J": "job-name",
    "L": "licenses", "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks", "o": "output",
    "p": "partition", "q": "qos", "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
}
SBATCH_SHORT_FLAGS = {
    "H": "hold", "h": "help", "I": "immediate", "k": "no-kill", "O": "overcommit", "Q": "quiet",
    "s": "oversubscribe", "u": "usage", "V": "version", "v": "verbose", "W": "wait",
}
# Long options that take no value (or an optional one, given only as --name=value).
SBATCH_LONG_FLAGS = frozenset({
    *SBATCH_SHORT_FLAGS.values(), "exclusive", "requeue", "no-requeue", "parsable", "test-only", "contiguous",
    "spread-job", "use-min-nodes", "ignore-pbs", "reboot", "get-user-env", "nice", "propagate", "overcommit",
})
# sbatch options that the launcher sets itself, so that the job's name (what squeue is asked
# for), its log, and its allocation agree with torchrun and the batch-size checks: how instead.
OWNED_SBATCH_OPTIONS = {
    "nodes": "from --nnodes; use that instead",
    "gpus-per-node": "from --nproc_per_node; use that instead",
    "gpus": "from --nproc_per_node (GPUs per node, one process each); use that instead",
    "gres": "from --nproc_per_node as --gpus-per-node; use that instead",
    "ntasks": "to one task per node (torchrun starts the processes); leave it out",
    "ntasks-per-node": "to one task per node (torchrun starts the processes); leave it out",
    "job-name": "from each run's name, which squeue is asked for; leave it out",
    "output": "to each run's folder (slurm-%x-%j.out); leave it out",
    "error": "to each run's log in its folder (with --output); leave it out",
    "export": "to ALL plus the offline variables; set variables in this shell instead",
    "wrap": "for zero-shot jobs only; leave it out",
}
# Options that may be given more than once.
REPEATABLE = frozenset({"verbose", "quiet"})


def taken(options: list[str], i: int) -> str:
    """What sbatch would read as the value of an option that has none: the next word, or the script."""
    return repr(options[i]) if i < len(options) else "the option the launcher adds next"


def sbatch_option_words(options: list[str]) -> list[tuple[str, str, str | None]]:
    """(as written, sbatch's long name, value or None) of each option in `options`, as sbatch's
    getopt reads them: -N2, -N 2, --nodes=2 and --nodes 2 are one option, nodes=2."""
    found, i = [], 0
    while i < len(options):
        word = options[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            if not eq:
                value = None
                if name not in SBATCH_LONG_FLAGS and i < len(options) and not options[i].startswith("-"):
                    value, i = options[i], i + 1
                elif name in OWNED_SBATCH_OPTIONS or name in SBATCH_SHORT_VALUES.values():
                    raise UsageError(f"--sbatch_args gives {word} no value (sbatch would take {taken(options, i)} as its value); write {word}=VALUE.")
            found.append((word, name, value))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            j = 1
            while j < len(word):  # a cluster of short options: -vH, -N2, -HN2
                letter = word[j]
                j += 1
                if letter in SBATCH_SHORT_VALUES:
                    value = word[j:]
                    if not value:
                        if i >= len(options) or options[i].startswith("-"):
                            raise UsageError(f"--sbatch_args gives -{letter} no value (sbatch would take {taken(options, i)} as its value); write -{letter} VALUE.")
                        value, i = options[i], i + 1
                    found.append((f"-{letter} {value}", SBATCH_SHORT_VALUES[letter], value))
                    break
                if letter in SBATCH_SHORT_FLAGS:
                    found.append((f"-{letter}", SBATCH_SHORT_FLAGS[letter], word[j:] or None if letter in "Ik" else None))
                    if letter in "Ik":
                        break
                    continue
                raise UsageError(f"--sbatch_args has {word!r}, and -{letter} is not an option of sbatch; give sbatch's options, such as --partition=gpu --time=12:00:00.")
        else:
            raise UsageError(
                f"--sbatch_args has {word!r}, which is not an option: sbatch would take it as the batch script "
                f"instead of {SLURM_SCRIPT}; give options only, such as --partition=gpu --time=12:00:00."
            )
    return found


def parse_sbatch_args(text: str) -> list[str]:
    """The options of --sbatch_args, checked before anything is submitted: none the launcher sets
    itself (in any of its forms), none given twice, no bare word, none missing its value."""
    try:
        options = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--sbatch_args {text!r} cannot be split into options ({e}).") from None
    seen: dict[str, str] = {}
    for written, name, value in sbatch_option_words(options):
        if name in OWNED_SBATCH_OPTIONS and (name != "gres" or "gpu" in (value or "")):
            long = f"--{name}"
            shown = long if written.split("=", 1)[0] == long else f"{written.split(' ', 1)[0]} ({long})"
            raise UsageError(f"--sbatch_args sets {shown}, which the launcher sets {OWNED_SBATCH_OPTIONS[name]}.")
        if name in seen and name not in REPEATABLE:
            raise UsageError(f"--sbatch_args gives --{name} twice ({seen[name]} and {written}); give it once.")
        seen[name] = written
    return options
