"""What `lookahead generate` and `lookahead calibrate` do (arguments parsed and checked by
`lookahead.cli`): the HF engine here, the llama.cpp engine in `lookahead.llamacpp.commands`."""

from __future__ import annotations

import sys

from lookahead.hf.recycling import RECYCLE_MODES


def say(message: str) -> None:
    """`message` on stderr, if stderr is open (print(file=None) would write it to stdout)."""
    if sys.stderr is not None:
        print(message, file=sys.stderr)


def _hf_generator(args):
    """The HF engine's generator from `args`, and what the statistics line says of it."""
    from lookahead.hf import LookaheadGenerator
    from lookahead.models import load_model, resolve_dtype

    args.dtype = resolve_dtype(args.dtype, args.device)
    model, tok = load_model(args.model, args.dtype, device=args.device)
    gen = LookaheadGenerator(
        model,
        tok,
        budget=args.budget,
        max_budget=args.max_budget,
        depth=args.depth,
        multi_branch=not args.single_branch,
        min_draft_score=args.min_draft_score,
        recycle=RECYCLE_MODES[args.recycle],
    )
    return gen, args.dtype


def generate(args) -> int:
    """`lookahead generate` on the engine `args.engine` names: streamed, then statistics."""
    from lookahead.hf import NO_CHAT_TEMPLATE

    if args.engine == "llamacpp":
        from lookahead.llamacpp.commands import generator

        gen, note = generator(args)
        extra = {}
    else:
        gen, note = _hf_generator(args)
        extra = {"repetition_penalty": args.repetition_penalty}

    chat = not args.no_chat
    if chat:
        try:
            gen.encode(args.prompt, chat=True)
        except ValueError as e:
            if str(e) != NO_CHAT_TEMPLATE:
                raise
            say("lookahead: the tokenizer has no chat template; using the prompt as is")
            chat = False

    def stream(_ids, delta):
        sys.stdout.write(delta)
        sys.stdout.flush()

    res = gen.generate(
        args.prompt,
        chat=chat,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_strings=args.stop,
        on_tokens=stream,
        **extra,
    )
    s = res.stats
    print()
    say(
        f"[{s.new_tokens} tokens in {s.total_s:.2f}s = {s.new_tokens / s.total_s:.1f} tok/s; "
        f"{s.steps} steps, {s.tokens_per_step:.2f} tokens/step, {s.mean_accepted:.2f} accepted "
        f"draft tokens/step; prefill {s.prefill_s:.2f}s, draft {s.draft_s:.3f}s, mask "
        f"{s.mask_s:.3f}s, forward {s.forward_s:.2f}s, verify {s.verify_s:.3f}s, KV fix-up "
        f"{s.kv_s:.3f}s, other {s.other_s:.3f}s (host {100 * s.host_overhead:.1f}% of forward); {note}, "
        + f"{sum(s.draft_nodes) / max(s.steps, 1):.1f} nodes/step by {gen.sizer!r}"
        + f"; finish: {res.finish_reason}]"
    )
    return 0


def calibrate(args) -> int:
    """`lookahead calibrate`: the measured verify cost by rows."""
    if args.engine == "llamacpp":
        from lookahead.llamacpp.commands import calibrate as calibrate_llamacpp

        return calibrate_llamacpp(args)
    from lookahead.costs import CONTEXTS, load_or_measure
    from lookahead.models import load_model, resolve_dtype

    args.dtype = resolve_dtype(args.dtype, args.device)
    model, _tok = load_model(args.model, args.dtype, device=args.device)
    costs = load_or_measure(model, refresh=True)
    print(
        f"verify cost by rows ({args.dtype}, {costs.key['device']}, {costs.key['threads']} threads)"
    )
    for ctx in (*CONTEXTS, 4 * CONTEXTS[-1]):
        print(costs.describe(ctx))
    return 0
