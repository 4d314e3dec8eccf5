"""lm-eval model class for this project's checkpoints, registered as ``nanogpt``.

    from spheretnorm.zeroshot.harness import NanoGPTLM
    lm = NanoGPTLM(ckpt="out/ckpt.pt", batch_size=16)
    lm_eval.simple_evaluate(model=lm, tasks=["piqa"])

Importing this module registers the name, so ``simple_evaluate(model="nanogpt",
model_args="ckpt=out/ckpt.pt")`` and ``python -m eval.lm_eval_cli --model nanogpt ...`` work.

Any connection loads: the model is rebuilt from the config stored in the checkpoint. Text is
tokenised with the GPT-2 BPE (tiktoken, offline), the same ids HF's GPT-2 tokenizer gives, and
<|endoftext|> (50256) is both the end-of-text token and the prefix for empty contexts, as for
lm-eval's ``hf`` model on GPT-2. Runs in bf16 autocast on CUDA, fp32 elsewhere; log-softmax
is always taken in fp32. Single process only (no data parallelism).
"""

from __future__ import annotations

import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from spheretnorm.runtime.device import autocast_context, available_device, resolve_dtype
from spheretnorm.data.tokenizer import EOT_TOKEN, GPT2_VOCAB_SIZE, get_gpt2_encoding
from spheretnorm.zeroshot.errors import EvalError
from spheretnorm.zeroshot.token_check import check_gpt2_tokenizer, resolve_checkpoint_path
from spheretnorm.model import GPT
from spheretnorm.runtime.checkpoint import load_checkpoint, load_model

MODEL_NAME = "nanogpt"
EOT_TEXT = "<|endoftext|>"
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's hf model uses the same default

# (context tokens, continuation tokens) and lm-eval's request triple around it.
TokenPair = tuple[list[int], list[int]]
TokenRequest = tuple[Any, list[int], list[int]]


# -----------------------------------------------------------------------------
# Loading checkpoints


def load_eval_model(path: str | Path) -> tuple[GPT, dict[str, Any]]:
    """Rebuild the model of a training checkpoint on the CPU; returns (model, checkpoint dict)."""
    path = resolve_checkpoint_path(path)
    source = f"Checkpoint {str(path)!r}"
    try:
        ckpt = load_checkpoint(path, map_location="cpu")
    except ValueError as exc:  # a dict of another format: model.py's message says which
        raise EvalError(str(exc)) from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError) as exc:
        # Not something torch.load can read at all (a text file, a safetensors file, ...).
        raise EvalError(f"{source} is not a PyTorch checkpoint file ({type(exc).__name__}: {exc}).") from None
    check_gpt2_tokenizer(ckpt, source)
    try:
        model = load_model(ckpt)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise EvalError(f"{source} does not match this version of model.py ({exc}).") from None
    return model, ckpt


# -----------------------------------------------------------------------------
# The lm-eval model


@dataclass
class _Generation:
    """One generate_until request while it runs."""

    tokens: list[int]  # context followed by what has been generated so far
    n_context: int
    until: list[str]
    max_new_tokens: int

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.n_context :]


# -----------------------------------------------------------------------------
# Packing: the choices of one multiple-choice question share one row


@dataclass
class _Pack:
    """One row of a scoring batch: a prefix, then the inputs of each continuation as a segment.

    Each segment attends to the prefix and to itself, never to another segment, and its
    positions continue from the end of the prefix; so every continuation is scored exactly as
    if it followed the prefix alone, while the prefix (the question, usually most of the
    tokens) runs once per question instead of once per choice. A continuation's first token is
    predicted at the last prefix position, its token j > 0 at its segment's position j - 1
    (a segment holds continuation[:-1]).
    """

    prefix: list[int]
    continuations: list[list[int]]
    pieces: list[int]  # the index of each continuation in the caller's list of pieces

    @property
    def length(self) -> int:
        return len(self.prefix) + sum(len(c) - 1 for c in self.continuations)

    def tokens(self) -> list[int]:
        return self.prefix + [t for c in self.continuations for t in c[:-1]]

    def positions(self) -> list[int]:
        n = len(self.prefix)
        return list(range(n)) + [n + j for c in self.continuations for j in range(len(c) - 1)]

    def segments(self) -> list[int]:
        """0 on the prefix, i + 1 on the segment of continuation i."""
        return [0] * len(self.prefix) + [i + 1 for i, c in enumerate(self.continuations) for _ in c[:-1]]

    def scored_columns(self) -> list[list[int]]:
        """For each continuation, the row positions whose logits predict its tokens."""
        columns, start = [], len(self.prefix)
        for c in self.continuations:
            columns.append([len(self.prefix) - 1] + list(range(start, start + len(c) - 1)))
            start += len(c) - 1
        return columns


def pack_pieces(pieces: list[TokenPair], block_size: int) -> list[_Pack]:
    """Rows for (context, continuation) pieces: pieces with the same context share as few rows
    of at most block_size tokens as they fit in. A piece too long for a row of its own keeps
    only the end of its context, as in lm-eval's hf model."""
    by_context: dict[tuple[int, ...], list[int]] = {}
    for j, (context, _) in enumerate(pieces):
        by_context.setdefault(tuple(context), []).append(j)
    packs: list[_Pack] = []
    for context, members in by_context.items():
        open_pack: _Pack | None = None
        for j in members:
            continuation = pieces[j][1]
            if len(context) + len(continuation) - 1 > block_size:
                keep = block_size - (len(continuation) - 1)  # >= 1: pieces are at most block_size long
                packs.append(_Pack(list(context[-keep:]), [continuation], [j]))
            elif open_pack is not None and open_pack.length + len(continuation) - 1 <= block_size:
                open_pack.continuations.append(continuation)
                open_pack.pieces.append(j)
            else:
                open_pack = _Pack(list(context), [continuation], [j])
                packs.append(open_pack)
    return packs


@dataclass
class _PackedBatch:
    """Model inputs for a batch of rows, right-padded with <|endoftext|>."""

    tokens: torch.Tensor  # (B, T)
    positions: torch.Tensor | None  # (B, T); None: 0..T-1 in every row
    mask: torch.Tensor | None  # (B, T, T), True where a query may attend; None: causal

    @classmethod
    def causal(cls, sequences: list[list[int]]) -> _PackedBatch:
        """Plain rows: causal attention already keeps the padding at the end invisible."""
        tokens = torch.full((len(sequences), max(len(s) for s in sequences)), EOT_TOKEN, dtype=torch.long)
        for i, seq in enumerate(sequences):
            tokens[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        return cls(tokens, None, None)

    @classmethod
    def of(cls, packs: list[_Pack]) -> _PackedBatch:
        if all(len(pack.continuations) == 1 for pack in packs):  # nothing shared: the fast causal path
            return cls.causal([pack.tokens() for pack in packs])
        shape = (len(packs), max(pack.length for pack in packs))
        tokens = torch.full(shape, EOT_TOKEN, dtype=torch.long)
        positions = torch.zeros(shape, dtype=torch.long)
        segments = torch.full(shape, -1, dtype=torch.long)  # padding: its own segment, never read
        for i, pack in enumerate(packs):
            tokens[i, : pack.length] = torch.tensor(pack.tokens())
            positions[i, : pack.length] = torch.tensor(pack.positions())
            segments[i, : pack.length] = torch.tensor(pack.segments())
        key, query = segments[:, None, :], segments[:, :, None]
        causal = torch.ones(shape[1], shape[1], dtype=torch.bool).tril()
        return cls(tokens, positions, causal & ((key == 0) | (key == query)))


@register_model(MODEL_NAME)
class NanoGPTLM(TemplateLM):
    """lm-eval model for a spheretnorm checkpoint (``ckpt``) or an in-memory GPT (``model``).

    Model arguments: ckpt, device ("auto": cuda > mps > cpu), dtype ("auto": bf16 on CUDA,
    fp32 elsewhere), batch_size (rows per forward pass; the choices of one question share a
    row), max_gen_toks (default for generate_until). With ``model=`` the GPT is put in eval
    mode on ``device``.
    """

    def __init__(
        self,
        ckpt: str | Path | None = None,
        model: GPT | None = None,
        device: str | None = "auto",
        dtype: str = "auto",
        batch_size: int | str = 1,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        max_batch_size: int | None = None,  # passed by lm-eval; only meaningful for "auto" sizes
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise EvalError(
                f"Unknown nanogpt model argument(s) {sorted(unknown)}; valid ones are ckpt, device, "
                "dtype, batch_size and max_gen_toks."
            )
        if (ckpt is None) == (model is None):
            raise EvalError("Give the nanogpt model exactly one of ckpt=PATH or model=GPT instance.")
        self._batch_size = _positive_int(batch_size, "batch_size")
        self._max_gen_toks = _positive_int(max_gen_toks, "max_gen_toks")
        self._ckpt_path = None if ckpt is None else str(ckpt)
        if model is None:
            model, _ = load_eval_model(ckpt)
            device = available_device(device or "auto")
        elif device in (None, "auto"):
            device = str(next(model.parameters()).device)  # evaluate where the caller keeps it
        self.model, self._device, self._dtype = _place(model, device, dtype)
        self.encoding = get_gpt2_encoding()

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> NanoGPTLM:
        """The model from --model_args; a model argument wins over lm-eval's --device / --batch_size, which its
        CLI always passes (with defaults) and which lm-eval's base class would pass twice (a TypeError)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> NanoGPTLM:
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    # -- what lm-eval asks of a model -------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return EOT_TOKEN

    @property
    def prefix_token_id(self) -> int:
        # lm-eval's hf model on GPT-2 conditions empty contexts (and rolling windows) on
        # <|endoftext|>; we do the same so scores are comparable.
        return EOT_TOKEN

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def tokenizer_name(self) -> str:
        return "gpt2"

    def get_model_info(self) -> dict[str, Any]:
        """Recorded by lm-eval under results["config"]."""
        return {
            "checkpoint": self._ckpt_path,
            "connection": self.model.config.connection,
            "model_config": asdict(self.model.config),
            "model_num_parameters": self.model.get_num_params(non_embedding=False),
            "model_dtype": self._dtype,
        }

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        # GPT-2 adds no BOS. A literal "<|endoftext|>" in the text becomes token 50256, as it
        # does with HF's GPT-2 tokenizer.
        return self.encoding.encode(string, allowed_special="all")

    def tok_decode(self, tokens: list[int]) -> str:
        return self.encoding.decode(tokens)

    # -- scoring ------------------------------------------------------------------

    @torch.inference_mode()
    def _logits_at(self, batch: "_PackedBatch", rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Logits (K, V) at positions (rows[k], cols[k]) of a batch of rows.

        The LM head runs on those K positions only: on multiple-choice items (a long
        context, a few continuation tokens) it would otherwise be the largest matmul of the
        pass, spent on logits nobody reads.
        """
        device = self._device
        pos = None if batch.positions is None else batch.positions.to(device)
        mask = None if batch.mask is None else batch.mask.to(device)
        with autocast_context(device.type, self._dtype):
            hidden = self.model.final_hidden(batch.tokens.to(device), pos, mask)
            return self.model.lm_head(hidden[rows.to(device), cols.to(device)])

    def _score_packs(self, packs: list[_Pack]) -> list[tuple[float, bool]]:
        """(sum of continuation log-probs, continuation is the greedy choice) for every
        continuation of every pack, in order."""
        cols = [pack.scored_columns() for pack in packs]
        rows = torch.cat([torch.full((len(c),), b) for b, pack_cols in enumerate(cols) for c in pack_cols])
        flat_cols = torch.cat([torch.tensor(c) for pack_cols in cols for c in pack_cols])
        logits = self._logits_at(_PackedBatch.of(packs), rows, flat_cols)
        continuations = [c for pack in packs for c in pack.continuations]
        targets = torch.tensor([t for c in continuations for t in c], device=logits.device)
        logprobs = F.log_softmax(logits.float(), dim=-1)
        token_lp = logprobs.gather(1, targets[:, None]).squeeze(1)
        greedy = logprobs.argmax(dim=-1) == targets
        n_cont = [len(c) for c in continuations]
        return [(float(lp.sum()), bool(g.all())) for lp, g in zip(token_lp.split(n_cont), greedy.split(n_cont))]

    def _pieces(self, context: list[int], continuation: list[int]) -> list[TokenPair]:
        """[(context, continuation)], or for a continuation longer than block_size (lm-eval's hf
        model stops with an assertion there) block_size-token pieces, each conditioned on all
        the text before it."""
        if not context or not continuation:
            raise ValueError("lm-eval passed an empty context or continuation token list.")
        block = self.max_length
        return [(context + continuation[:i], continuation[i : i + block]) for i in range(0, len(continuation), block)]

    def _loglikelihood_tokens(
        self, requests: list[TokenRequest], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        pieces: list[TokenPair] = []
        owners: list[int] = []
        for i, (_, context, continuation) in enumerate(requests):
            for piece in self._pieces(context, continuation):
                pieces.append(piece)
                owners.append(i)
        packs = pack_pieces(pieces, self.max_length)
        # Longest first: lengths in a batch are similar (little padding) and the largest batch
        # comes first, so an out-of-memory error shows at once rather than at the end.
        packs.sort(key=lambda pack: -pack.length)
        logprob = [0.0] * len(requests)
        greedy = [True] * len(requests)
        pbar = tqdm(total=len(pieces), disable=disable_tqdm, desc="nanogpt loglikelihood")
        for start in range(0, len(packs), self.batch_size):
            batch = packs[start : start + self.batch_size]
            scored = [j for pack in batch for j in pack.pieces]
            for j, (lp, g) in zip(scored, self._score_packs(batch)):
                logprob[owners[j]] += lp
                greedy[owners[j]] &= g
            pbar.update(len(scored))
        pbar.close()
        results = list(zip(logprob, greedy))
        for (cache_key, _, _), answer in zip(requests, results):
            if cache_key is not None:  # rolling windows carry no cache key
                self.cache_hook.add_partial("loglikelihood", cache_key, answer)
        return results

    def rolling_windows(self, tokens: list[int]) -> list[TokenPair]:
        """Disjoint (context, continuation) windows scoring every token once, as lm-eval's hf model."""
        windows = lm_utils.get_rolling_token_windows(
            token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
        )
        return [lm_utils.make_disjoint_window(w) for w in windows]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows: list[TokenRequest] = []
        owners: list[int] = []
        for i, (string,) in enumerate(req.args for req in requests):
            for context, continuation in self.rolling_windows(self.tok_encode(string)):
                windows.append((None, context, continuation))
                owners.append(i)
        # All windows of all documents go through one batched pass.
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, scores):
            totals[i] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation ---------------------------------------------------------------

    def _generation_settings(self, gen_kwargs: dict[str, Any]) -> tuple[list[str], int]:
        """Stop strings (always including <|endoftext|>) and the token budget of one request."""
        kwargs = dict(gen_kwargs or {})
        if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
            raise EvalError("The nanogpt model generates greedily only; use do_sample=False and temperature=0.")
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        if EOT_TEXT not in until:
            until.append(EOT_TEXT)
        max_new = kwargs.get("max_gen_toks") or kwargs.get("max_new_tokens") or self.max_gen_toks
        return until, int(max_new)

    def _finished(self, gen: _Generation) -> bool:
        if len(gen.new_tokens) >= gen.max_new_tokens:
            return True
        text = self.tok_decode(gen.new_tokens)
        return any(stop in text for stop in gen.until)

    def _generate_greedy(self, gens: list[_Generation]) -> None:
        """Extend every generation in place, one token per step, until each is finished.

        Each row sees its own last block_size tokens and reads the logits at its own last
        position, so rows of different lengths share a forward pass without an attention mask.
        """
        active = [g for g in gens if g.max_new_tokens > 0]
        while active:
            windows = [g.tokens[-self.max_length :] for g in active]
            last = torch.tensor([len(w) - 1 for w in windows])
            logits = self._logits_at(_PackedBatch.causal(windows), torch.arange(len(active)), last)
            # Rows past GPT-2's 50257 tokens are padding of the embedding table, not tokens.
            step = logits[:, :GPT2_VOCAB_SIZE]
            for gen, token in zip(active, step.argmax(dim=-1).tolist()):
                gen.tokens.append(token)
            active = [g for g in active if not self._finished(g)]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        gens = []
        for context, gen_kwargs in (req.args for req in requests):
            until, max_new = self._generation_settings(gen_kwargs)
            tokens = self.tok_encode(context) or [self.prefix_token_id]
            gens.append(_Generation(tokens, len(tokens), until, max_new))
        order = sorted(range(len(gens)), key=lambda i: -gens[i].n_context)
        pbar = tqdm(total=len(gens), disable=disable_tqdm, desc="nanogpt generate_until")
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            self._generate_greedy([gens[i] for i in batch])
            pbar.update(len(batch))
        pbar.close()
        outputs = []
        for req, gen in zip(requests, gens):
            text = self.tok_decode(gen.new_tokens)
            for stop in gen.until:  # the answer ends before the first stop string
                text = text.split(stop)[0]
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", req.args, text)
        return outputs


def _place(model: GPT, device: str, dtype: str) -> tuple[GPT, torch.device, str]:
    """The model in eval mode on the device, with the autocast dtype to run it in."""
    try:
        torch_device = torch.device(device)
        dtype = resolve_dtype(dtype, torch_device.type)
        return model.to(torch_device).eval(), torch_device, dtype
    except ValueError as exc:  # an unknown dtype
        raise EvalError(str(exc)) from None
    except (RuntimeError, AssertionError) as exc:  # e.g. "cuda" on a machine without CUDA
        raise EvalError(f"Cannot run the model on device {device!r} ({exc}).") from None


def _positive_int(value: int | str, name: str) -> int:
    """lm-eval's CLI passes numbers as strings; 'auto' batch sizing is not supported."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise EvalError(f"{name} must be a positive integer for the nanogpt model, got {value!r}.")
    return number
