"""An hour of mixed traffic on a real SGLang CPU server serving LOOKAHEAD: errors, greedy
mismatches, memory and latency over time.

First a server without speculation answers a pool of greedy jobs (Spec-Bench prompts and long
prompts made of several of them; plain, with a stop string, with a JSON schema, with a regex):
those are the references. Then one LOOKAHEAD server (`--enable-metrics`, a trie capacity the
traffic fills, so eviction runs all along) serves `--clients` clients for `--minutes`, each
looping over a random mix:
- greedy jobs from the pool, under one of `--namespaces` extra keys and a random per-request
  switch (none, `enabled: false`, a budget, a pinned namespace): output must equal the
  reference token for token;
- sampled requests (temperature 0.8, top-p 0.95, some with a JSON schema);
- streamed requests the client hangs up on after a few chunks (aborts);
- requests with a bad `custom_params["lookahead"]`: HTTP 400 expected.
Anything else (an error, a wrong status, a timeout) counts as an error. Every `--sample-s`
seconds: the server's RSS (all its processes), the trie's gauges from `/metrics`, and the
latency percentiles of the requests finished since the last sample.

    python -m benchmarks.sglang_soak --minutes 60 --json benchmarks/results/sglang_soak.json \\
        --plot benchmarks/results/sglang_soak.png
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))

from cpu_server import CpuServer, ServerFailed  # noqa: E402

from benchmarks.sglang_cpu_serving import ANSWER_SCHEMA, prompts_of  # noqa: E402

LOOKAHEAD = ["--speculative-algorithm", "LOOKAHEAD", "--enable-metrics"]
# A long prompt is several questions, at most this many characters (~3k tokens of 8k context).
LONG_CHARS = 12_000
REGEX = "[A-Z][a-z ,]{10,60}[.]"
# Greedy job kinds -> extra sampling params (the reference has the same).
KINDS = {
    "plain": {},
    "stop": {"stop": ["\n\n"]},
    "json": {"json_schema": json.dumps(ANSWER_SCHEMA)},
    "regex": {"regex": REGEX},
}
SWITCHES = [None, {"enabled": False}, {"budget": 2}, {"namespace": "pinned"}]
BAD_SWITCHES = [{"budget": 999}, {"enabled": "yes"}, {"colour": 1}, "on"]
# The mix of a client's next request: kind -> weight.
MIX = {"greedy": 0.6, "sampled": 0.2, "abort": 0.1, "bad": 0.1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", help="HF model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--namespaces", type=int, default=4)
    p.add_argument("--per-category", type=int, default=4, help="Spec-Bench questions each")
    p.add_argument("--questions", help="Spec-Bench question.jsonl (default: bench's default)")
    p.add_argument("--long-prompts", type=int, default=4, help="prompts of up to 6 questions")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-draft-tokens", type=int, default=8)
    p.add_argument("--capacity", type=int, default=300_000, help="trie nodes")
    p.add_argument(
        "--capacity-bytes", type=int, default=64 << 20, help="LOOKAHEAD_CONFIG capacity_bytes"
    )
    p.add_argument("--sample-s", type=float, default=30.0)
    p.add_argument("--warmup-min", type=float, default=10.0, help="RSS growth counted after")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--plot")
    p.add_argument("--log-dir")
    p.add_argument("--report", metavar="JSON", help="print a soak's table by window and stop")
    return p.parse_args(argv)


def jobs_of(args, model_path: Path) -> list[tuple[str, str, dict]]:
    """The greedy pool: (prompt, kind, params)."""
    prompts = [t for _, t in prompts_of(args, model_path)]
    rng = random.Random(args.seed)
    long = []
    for _ in range(args.long_prompts):
        text = ""
        for q in rng.sample(prompts, min(6, len(prompts))):
            if len(text) + len(q) > LONG_CHARS:
                break
            text += q + "\n\n"
        long.append(text)
    jobs = []
    for i, p in enumerate(prompts + long):
        kinds = list(KINDS) if i % 2 == 0 else ["plain", rng.choice(list(KINDS))]
        for kind in dict.fromkeys(kinds):
            jobs.append((p, kind, {"max_new_tokens": args.output_len, **KINDS[kind]}))
    return jobs


def post(server: CpuServer, body: dict, timeout: float = 600) -> tuple[int, dict]:
    req = urllib.request.Request(
        server.url + "/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def hang_up(server: CpuServer, text: str, chunks: int) -> None:
    body = {
        "text": text,
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 2000, "ignore_eos": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"stream answered {resp.status}")
    seen = 0
    while seen < chunks:
        line = resp.readline()
        if not line:
            raise RuntimeError("the stream ended before the client hung up")
        seen += line.startswith(b"data:")
    conn.sock.shutdown(2)
    conn.close()


def quantile(xs: list[float], f: float) -> float | None:
    """The `f` quantile of sorted `xs` (nearest rank), or None for no data."""
    return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else None


class Soak:
    def __init__(self, server: CpuServer, jobs, reference: dict, args) -> None:
        self.server, self.jobs, self.reference, self.args = server, jobs, reference, args
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(["greedy", "sampled", "abort", "bad", "errors"], 0)
        self.counts["mismatches"] = 0
        self.latencies: list[float] = []  # finished greedy/sampled requests since last sample
        self.finished: list[tuple[float, float, str]] = []  # (t_min at the end, seconds, kind)
        self.t0 = time.monotonic()
        self.errors: list[str] = []
        self.samples: list[dict] = []

    def one(self, rng: random.Random) -> None:
        kind = rng.choices(list(MIX), weights=list(MIX.values()))[0]
        t0 = time.perf_counter()
        if kind == "greedy":
            text, job_kind, params = rng.choice(self.jobs)
            sp = {"temperature": 0, **params}
            switch = rng.choice(SWITCHES)
            if switch is not None:
                sp["custom_params"] = {"lookahead": switch}
            body = {
                "text": text,
                "sampling_params": sp,
                "extra_key": f"tenant-{rng.randrange(self.args.namespaces)}",
            }
            status, out = post(self.server, body)
            if status != 200:
                raise RuntimeError(f"greedy {job_kind}: HTTP {status} {str(out)[:200]}")
            want = self.reference[(text, job_kind)]
            if out["output_ids"] != want:
                with self.lock:
                    self.counts["mismatches"] += 1
                    self.errors.append(f"mismatch: {job_kind} {switch} {text[:60]!r}")
        elif kind == "sampled":
            text, _, params = rng.choice(self.jobs)
            sp = {"temperature": 0.8, "top_p": 0.95, "max_new_tokens": self.args.output_len}
            if rng.random() < 0.3:
                sp["json_schema"] = KINDS["json"]["json_schema"]
            status, out = post(self.server, {"text": text, "sampling_params": sp})
            if status != 200 or not out.get("output_ids"):
                raise RuntimeError(f"sampled: HTTP {status} {str(out)[:200]}")
        elif kind == "abort":
            hang_up(self.server, rng.choice(self.jobs)[0], rng.randrange(1, 20))
        else:
            sp = {"max_new_tokens": 8, "custom_params": {"lookahead": rng.choice(BAD_SWITCHES)}}
            status, out = post(self.server, {"text": "Hello", "sampling_params": sp})
            if status != 400:
                raise RuntimeError(f"a bad switch got HTTP {status}, not 400")
        with self.lock:
            self.counts[kind] += 1
            if kind in ("greedy", "sampled"):
                took = time.perf_counter() - t0
                self.latencies.append(took)
                self.finished.append(((time.monotonic() - self.t0) / 60, took, kind))

    def client(self, i: int, deadline: float) -> None:
        rng = random.Random(self.args.seed * 1000 + i)
        while time.monotonic() < deadline:
            try:
                self.one(rng)
            except Exception as e:  # counted, and the client goes on
                with self.lock:
                    self.counts["errors"] += 1
                    self.errors.append(f"{type(e).__name__}: {str(e)[:300]}")
                if self.server.proc.poll() is not None:
                    return

    def sample(self, t0: float) -> None:
        with self.lock:
            lat, self.latencies = sorted(self.latencies), []
            counts = dict(self.counts)
        m = {}
        try:
            m = self.server.metrics()
        except OSError as e:
            with self.lock:
                self.errors.append(f"metrics: {e}")
        self.samples.append(
            {
                "t_min": (time.monotonic() - t0) / 60,
                "rss_mb": self.server.rss_mb(),
                "finished": len(lat),
                "latency_p50_s": statistics.median(lat) if lat else None,
                "latency_p90_s": quantile(lat, 0.9),
                "latency_p99_s": quantile(lat, 0.99),
                **counts,
                **{k.removeprefix("lookahead_"): v for k, v in m.items()},
            }
        )
        print(json.dumps(self.samples[-1]), flush=True)

    def run(self) -> None:
        t0 = self.t0 = time.monotonic()
        deadline = t0 + self.args.minutes * 60
        with ThreadPoolExecutor(self.args.clients) as pool:
            futs = [pool.submit(self.client, i, deadline) for i in range(self.args.clients)]
            while time.monotonic() < deadline and not all(f.done() for f in futs):
                time.sleep(max(min(self.args.sample_s, deadline - time.monotonic()), 0))
                self.sample(t0)
            while not all(f.done() for f in futs):  # the last requests finish
                time.sleep(1)
            self.sample(t0)
            for f in futs:
                f.result()


def references(model_path: Path, jobs, log_dir: Path, env: dict) -> dict:
    ref = {}
    with CpuServer(model_path, [], log_dir / "plain.log", env=env) as plain:

        def one(job):
            text, kind, params = job
            return (text, kind), plain.generate(text, **params)["output_ids"]

        with ThreadPoolExecutor(4) as pool:
            for key, ids in pool.map(one, jobs):
                ref[key] = ids
    return ref


def summary(samples: list[dict], warmup_min: float) -> dict:
    after = [s for s in samples if s["t_min"] >= warmup_min] or samples[-1:]
    last = samples[-1]
    rss = [s["rss_mb"] for s in after]
    return {
        "minutes": last["t_min"],
        "requests": sum(last[k] for k in ("greedy", "sampled", "abort", "bad")),
        **{k: last[k] for k in ("greedy", "sampled", "abort", "bad", "errors", "mismatches")},
        "rss_mb_at_warmup": rss[0],
        "rss_mb_end": rss[-1],
        "rss_mb_max_after_warmup": max(rss),
        "rss_growth_mb_after_warmup": rss[-1] - rss[0],
        "trie_bytes_max": max(s.get("trie_bytes", 0) for s in samples),
        "evicted_nodes": last.get("evicted_nodes_total"),
        # per request and step, from the server's counters
        "tokens_per_step": (
            last["emitted_tokens_total"] / last["request_steps_total"]
            if last.get("request_steps_total")
            else None
        ),
    }


def windows(payload: dict, minutes: float = 10.0) -> list[dict]:
    """The run cut in `minutes`-long windows: traffic, latency, memory and the trie in each."""
    samples, finished = payload["samples"], payload.get("finished", [])
    rows, start, prev = [], 0.0, None
    while start < samples[-1]["t_min"] - 1e-6:
        end = start + minutes
        if samples[-1]["t_min"] - end < 1.0:  # the last requests' tail joins the last window
            end = samples[-1]["t_min"]
        inside = [s for s in samples if start < s["t_min"] <= end + 1e-6]
        if not inside:
            break
        last, before = inside[-1], prev or {}
        delta = {k: v - before.get(k, 0) for k, v in last.items() if isinstance(v, (int, float))}
        lat = sorted(x[1] for x in finished if start < x[0] <= end + 1e-6)
        steps = delta.get("request_steps_total")
        rows.append(
            {
                "minutes": f"{start:.0f}-{min(end, last['t_min']):.0f}",
                **{k: delta[k] for k in ("greedy", "sampled", "abort", "bad", "errors")},
                "mismatches": delta["mismatches"],
                **{f"p{int(f * 100)}_s": quantile(lat, f) for f in (0.5, 0.9, 0.99)},
                "rss_mb_min": min(s["rss_mb"] for s in inside),
                "rss_mb_max": max(s["rss_mb"] for s in inside),
                "trie_nodes": last.get("trie_nodes"),
                "trie_mb_max": max(s.get("trie_bytes", 0) for s in inside) / 2**20,
                "evicted": delta.get("evicted_nodes_total"),
                "tokens_per_step": delta["emitted_tokens_total"] / steps if steps else None,
            }
        )
        prev, start = last, end
    return rows


def report(path: str, minutes: float = 10.0) -> str:
    """A markdown table of `windows` from a soak's JSON."""
    payload = json.loads(Path(path).read_text())
    head = (
        "| minutes | greedy | sampled | aborted | bad (400) | errors | mismatches "
        "| latency p50 / p90 / p99 s | RSS MB min-max | trie nodes | trie MB | evicted "
        "| tokens/step |"
    )
    lines = [head, "|" + "---|" * 13]
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in windows(payload, minutes):
        lines.append(
            f"| {r['minutes']} | {r['greedy']} | {r['sampled']} | {r['abort']} | {r['bad']} "
            f"| {r['errors']} | {r['mismatches']} "
            f"| {f(r['p50_s'])} / {f(r['p90_s'])} / {f(r['p99_s'])} "
            f"| {r['rss_mb_min']:.0f}-{r['rss_mb_max']:.0f} | {f(r['trie_nodes'], 0)} "
            f"| {r['trie_mb_max']:.1f} | {f(r['evicted'], 0)} | {f(r['tokens_per_step'], 2)} |"
        )
    return "\n".join(lines)


def plot(samples: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_min"] for s in samples]
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(t, [s["rss_mb"] for s in samples], color="C0")
    a.set_ylabel("server RSS, all processes (MB)", color="C0")
    trie = a.twinx()  # the trie is a few MB of the server's GB: its own scale
    trie.plot(t, [s.get("trie_bytes", 0) / 2**20 for s in samples], color="C1")
    trie.set_ylabel("trie bytes (MiB)", color="C1")
    trie.set_ylim(bottom=0)
    for key in ("latency_p50_s", "latency_p90_s", "latency_p99_s"):
        b.plot(t, [s[key] for s in samples], label=key.removeprefix("latency_"))
    b.set_ylabel("latency of the last 30 s (s)")
    b.set_xlabel("minutes")
    b.legend()
    fig.suptitle("LOOKAHEAD on a CPU SGLang server: mixed traffic")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        print(report(args.report))
        return 0
    from lookahead.models import default_model_path
    from lookahead.output import header, write_json

    # The run's context as it starts: the code the server runs is the code of this moment.
    payload = header("python -m benchmarks.sglang_soak " + " ".join(argv or sys.argv[1:]))
    model_path = Path(args.model_path) if args.model_path else default_model_path()
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="sglang_soak_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": str(args.threads)}
    jobs = jobs_of(args, model_path)
    print(f"{len(jobs)} greedy jobs; references from a server without speculation", flush=True)
    t = time.monotonic()
    reference = references(model_path, jobs, log_dir, env)
    print(f"references in {time.monotonic() - t:.0f} s; logs in {log_dir}", flush=True)
    server_args = LOOKAHEAD + [
        "--speculative-num-draft-tokens",
        str(args.num_draft_tokens),
        "--speculative-ngram-capacity",
        str(args.capacity),
    ]
    env["LOOKAHEAD_CONFIG"] = json.dumps(
        {"stats_interval_s": 60, "capacity_bytes": args.capacity_bytes}
    )
    with CpuServer(model_path, server_args, log_dir / "lookahead.log", env=env) as server:
        soak = Soak(server, jobs, reference, args)
        try:
            soak.run()
        except ServerFailed as e:
            soak.errors.append(f"server failed: {e}")
    result = summary(soak.samples, args.warmup_min)
    print(json.dumps(result, indent=1))
    for e in soak.errors[:20]:
        print("  ", e)
    if args.json:
        payload.update(
            settings=vars(args),
            model=str(model_path),
            summary=result,
            errors=soak.errors[:200],
            samples=soak.samples,
            finished=soak.finished,
        )
        write_json(args.json, payload)
    if args.plot:
        plot(soak.samples, args.plot)
    return 1 if result["errors"] or result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
