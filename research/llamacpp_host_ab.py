"""A/B of two versions of the llama.cpp engine's Python side: its host time per step.

    git archive OLD python | tar x -C /tmp/old       # the old version's package, then a core:
    ln -s "$PWD"/python/lookahead/_core.abi3.so /tmp/old/python/lookahead/   # this one, or its own
    python -m research.llamacpp_host_ab /tmp/old/python python [--quant q4_0] [--rounds 3]

Each version runs in a process of its own (`PYTHONPATH` its `python/` folder first), one after
the other in rounds whose order alternates, so the VM's drift hits both alike; each loads the
core in its folder (one build for both where the old Python works with it, else the old
version's own, `cargo build --release --features python` at OLD copied in as
`lookahead/_core.abi3.so`) and both the same kept cost curve
(`$LOOKAHEAD_COST_DIR`). A process decodes 3 Spec-Bench prompts of each of mt_bench, qa and
math_reasoning (128 new tokens, greedy, flash attention on, 2 threads) with lookahead and
reports, per step: the step's host time besides the forward (`GenerationStats`: draft, tree
inputs, verdict, KV bookkeeping, the rest), the drafter's share of it (`drafter_s`: the trie's
draft and extend, the sizer's cut and learning) and the Python side of its forwards
(`model.decode` less `llama_decode`, the prompts' chunks counted in). Prints each process's numbers and the median of
new / old over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What one process runs (the version under test is whichever `lookahead` PYTHONPATH finds).
CHILD = r"""
import collections, json, sys
import lookahead
from research.llamacpp_host_split import prepared, timer

m, gen, ids = prepared(sys.argv[1], "mt_bench,qa,math_reasoning")
spent = collections.defaultdict(float)
wrap = timer(spent, collections.Counter())
wrap(m, "decode", "decode")
wrap(m.ll, "llama_decode", "llama_decode")
host = steps = drafter = 0.0
for x in ids:
    st = gen.generate(x, 128).stats
    host += st.draft_s + st.mask_s + st.verify_s + st.kv_s + st.other_s
    drafter += st.drafter_s
    steps += st.steps
fwd = spent["decode"] - spent["llama_decode"]
print(json.dumps({"package": lookahead.__file__, "steps": steps,
                  "host_us": 1e6 * host / steps, "drafter_us": 1e6 * drafter / steps,
                  "decode_python_us": 1e6 * fwd / steps}))
"""


def run(python_dir: str, quant: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([python_dir, str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", CHILD, quant], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.llamacpp_host_ab")
    p.add_argument("old", help="the old version's python/ folder (its core linked in)")
    p.add_argument("new", help="the new version's python/ folder")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.quant}, "
          f"old {args.old}, new {args.new}; us per step")  # fmt: skip
    got: dict = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            x = run(getattr(args, name), args.quant)
            got[name].append(x)
            print(f"round {r} {name}: host {x['host_us']:.1f}  drafter {x['drafter_us']:.1f}  "
                  f"python side of the forward {x['decode_python_us']:.1f}  "
                  f"({x['steps']:.0f} steps; {x['package']})",
                  flush=True)  # fmt: skip
    for key in ("host_us", "drafter_us", "decode_python_us"):
        ratios = [n[key] / o[key] for n, o in zip(got["new"], got["old"], strict=True)]
        old = statistics.median(x[key] for x in got["old"])
        new = statistics.median(x[key] for x in got["new"])
        print(f"{key}: old {old:.1f}, new {new:.1f}; new / old by round, median "
              f"{statistics.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
