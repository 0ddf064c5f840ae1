"""Language models behind OpenAI's API, side by side in one run on one machine with one client (issue 45's targets).

Run: `.venv/bin/python benchmarks/llm_serving.py [--rounds R] [--threads N] [--venvs DIR] [--parts generation
embeddings]`. Writes benchmarks/results/llm_serving.json (or ``--out``). A dev tool, not a test: a few minutes on
2 cores once the venv exists. The first run makes a venv for `transformers serve` under ``--venvs`` (default
``$XDG_CACHE_HOME/workbench-peers``, as benchmarks/peers.py): PyTorch of this interpreter's version (its CPU build,
found through pip's find-links as the Makefile passes them to uv) and ``transformers[serving]`` of this
interpreter's transformers; later runs reuse it.

**Generation against `transformers serve`.** One generator, built here as benchmarks/generation.py builds it (a GPT-2
of 4 layers, hidden 256, random weights, a byte-level BPE tokenizer of 1,000 tokens trained on the spot, no end
token, so every answer runs to ``max_tokens``), with a chat template, saved once by ``save_pretrained`` and served
from that one folder by:

- ``workbench``: `workbench serve --model_repository=…` (the folder's ``workbench.json``: the huggingface platform,
  task text-generation; continuous batching is how it always generates, ``--max_batched_tokens`` 160, its CPU
  default);
- ``transformers-serve-cb``: `transformers serve FOLDER --continuous-batching` (transformers' own
  ``ContinuousBatchingManager`` with paged attention; ``--cb-max-batch-tokens 160`` like workbench's budget,
  ``--cb-block-size 32 --cb-num-blocks 256``, enough for 16 sequences of 100 tokens);
- ``transformers-serve``: the same without ``--continuous-batching``, its default (``model.generate`` one request
  after another on its inference thread).

Both on the CPU, PyTorch on ``--threads`` intra-op threads (default 1: workbench's ``--pytorch_threads``, and
``OMP_NUM_THREADS`` for `transformers serve`, which has no flag of its own), ``HF_HUB_OFFLINE=1``. All the servers
run at once and take turns (``--rounds`` rounds; each round measures every server at 1 stream and at 16, the order
reversed every other round), so a burst of other work falls on all of them; the CPU each server used while the
others were measured is recorded (it should be near nothing). The client is the official ``openai`` package's
``AsyncOpenAI``, one per server: each stream one ``chat.completions.create(stream=True, temperature=0,
max_tokens=64)`` of its own prompt (16 random words from the corpus), all started at once. Tokens/s: each answer's
``max_tokens`` (checked: its ``finish_reason`` is ``length``; the content chunks are counted too) over the round's
wall time, the median round. Time to first token: from a stream's request to its first content chunk, p50 and p95
over every stream of every round.

That burst (every stream's request at the same instant, every answer the same length) is the worst case for time to
first token: 16 prompts arrive together, so the last waits for all 16 to be prefilled, which on a CPU costs what
their tokens cost (on 2 cores: the median stream's first token cannot come before half of that work, whatever the
scheduler). **Sustained load** is also measured (``--sustained_seconds``, 10 by default; 0 leaves it out), on
workbench and ``transformers-serve-cb`` (the one-at-a-time server queues its requests for seconds): 1 and 16 streams
kept busy, each sending its next request the moment its last answer ends, ``max_tokens`` drawn from 32 to 96 (a
mean of 64: answers of one length would keep the streams in step, arriving together every time, as no real load
does), the same seeds for every server. After 2 s of warm-up, tokens/s is the content chunks received in the window
over its length, and time to first token is over every request sent in the window (p50, p95); rounds as above.

**Embeddings at 32 clients against the in-process rate.** A BERT-like encoder (4 layers, hidden 256, 4 heads, random
weights, a WordPiece tokenizer of 1,000 tokens trained here; the feature-extraction task: mean pooling and
normalisation) served by `workbench serve --enable_batching` (max_batch_size 64, batch_timeout_micros 0, one batch
thread: benchmarks/_common.py's BATCHING), 32 clients each sending one text (12 to 20 random words) to
``/v1/embeddings`` after the other, for ``--seconds`` after a warm-up: texts/s, the mean batch the server formed
(its ``workbench_batch_size`` metric) and latency p50/p99. Each round measures three clients
(``--embedding_clients``): the ``openai`` package's ``AsyncOpenAI`` (``embeddings.create``; it costs about 2 ms of
CPU a request, on the cores the server uses), a bare ``aiohttp`` session sending the same body (about 0.3 ms), and
``wrk`` where it is installed (``apt-get install wrk``; compiled, one thread, 32 keep-alive connections POSTing the
same bodies in turn: 0.01 of a core at these rates, a tenth of ``aiohttp``'s, so that the server does not share its
cores with its client's Python).
Against the same version loaded in this process by the platform's loader and called as the batcher calls it
(``run_requests`` with one feed of one text per request, so tokenizing, padding, the forward pass and pooling all
count), batches of the served mean batch size, for as long: texts/s. Served and in-process alternate (``--rounds``),
the server idle while this process computes. Also recorded: the CPU a text of the server's event loop (its main
thread) and of its other threads (the inference thread), and the in-process call's own.
``--embedding_server_flags=--model_runners=1`` serves the encoder from a model runner process (the event loop and
the model then hold no GIL in common; the server's CPU figures then count the serving process alone, not its
runner). ``--generation_server_flags`` does the same for this checkout's generator (not the baseline's), e.g.
``--generation_server_flags=--max_batched_tokens=160``, a setting's effect beside the same tree without it.

``--baseline_tree DIR`` serves another workbench checkout (a worktree of main, say) beside this one as
``workbench-baseline``, in every generation round, burst and sustained: a change's ratios taken in the same minutes
(``workbench_over_workbench_baseline``, and the baseline's own 16-over-1 ratios). The embeddings part serves it too,
taking turns with this checkout's server in every round (each idle while the other is measured), each against the
in-process rate measured right after it (``baseline``, and ``served_over_baseline`` a round).

The machine's load average before and after, the versions and the ratios are in the JSON. On a 2-core machine the
client shares the cores with the server: the ratios, taken in the same minutes, are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import generation
from _common import (
    BATCHING,
    MONITORING,
    counters_since,
    free_port,
    loop_cpu_seconds,
    process_cpu_seconds,
    save_results,
    server_counters,
)
from generation import WORDS
from peers import Running, Server, versions, wrk_script_load

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "workbench-baseline"  # --baseline_tree's server
MAX_TOKENS = 64
STREAMS = 16
EMBED_CLIENTS = 32
CB_FLAGS = ("--cb-block-size", "32", "--cb-num-blocks", "256", "--cb-max-batch-tokens", "160")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
REPORTED = ("transformers", "torch", "tokenizers", "openai", "fastapi", "uvicorn", "starlette", "httpx")


# ============================================================================================= models, built here
def corpus(rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(400)]


def build_generator(version: Path) -> list[str]:
    """The generator's version folder (benchmarks/generation.py's, with a chat template), and a prompt a stream."""
    return generation.build(version, CHAT_TEMPLATE)


def build_encoder(version: Path) -> list[str]:
    """The encoder's version folder (feature-extraction), and the texts the clients send."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    rng = random.Random(1)
    raw = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    raw.normalizer = normalizers.BertNormalizer(lowercase=True)
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    raw.train_from_iterator(corpus(rng), trainers.WordPieceTrainer(vocab_size=1000, special_tokens=special))
    cls, sep = raw.token_to_id("[CLS]"), raw.token_to_id("[SEP]")
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    raw.decoder = decoders.WordPiece(prefix="##")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=128,
    )  # fmt: skip
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(fast), hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        max_position_embeddings=128,
    )  # fmt: skip
    BertModel(config).save_pretrained(version)
    fast.save_pretrained(version)
    (version / "workbench.json").write_text(json.dumps({"platform": "huggingface", "task": "feature-extraction"}))
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 20))) for _ in range(512)]


# ============================================================================================= servers
def ensure_transformers_serve(root: Path, log: Callable[[str], None]) -> Path:
    """`transformers serve`'s venv python: this interpreter's PyTorch (the CPU build, from pip's find-links where
    the machine keeps it, else PyTorch's CPU index) and transformers[serving] of this interpreter's transformers."""
    import torch
    import transformers

    venv = root / "transformers-serve"
    python = venv / "bin" / "python"
    wanted = [f"torch=={torch.__version__.split('+')[0]}", f"transformers[serving]=={transformers.__version__}"]
    stamp = venv / ".workbench-peers"
    if python.exists() and stamp.exists() and stamp.read_text() == "\n".join(wanted):
        return python
    log(f"transformers serve: installing {' '.join(wanted)} into {venv} (minutes)")
    base = getattr(sys, "_base_executable", sys.executable)
    if not python.exists():
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
    uv = Path(sys.executable).parent / "uv"
    links = (
        os.environ.get("PIP_FIND_LINKS")
        or subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
        ).stdout.strip()
    )
    env = dict(os.environ, UV_FIND_LINKS=",".join(links.split())) if links else dict(os.environ)
    pip_log = root / "transformers-serve-pip.log"
    with open(pip_log, "w") as out:
        for requirement in wanted:  # torch first, so that transformers' resolution keeps it (not a CUDA build)
            if uv.exists():
                command = [str(uv), "pip", "install", "--python", str(python), requirement]
            else:
                command = [str(python), "-m", "pip", "install", requirement]
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"installing {requirement} failed:\n{pip_log.read_text()[-3000:]}")
    stamp.write_text("\n".join(wanted))
    return python


def thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}


def workbench_server(repository: Path, threads: int, *extra: str, tree: Path = ROOT, peer: str = "workbench") -> Server:
    """`workbench serve` of ``tree`` (this checkout, or ``--baseline_tree``'s) on ``repository``."""
    port = free_port()
    command = [
        sys.executable, "-m", "workbench", "serve", f"--model_repository={repository}", f"--rest_api_port={port}",
        "--port=0", "--file_system_poll_wait_seconds=0", "--pytorch_device=cpu", f"--pytorch_threads={threads}",
        "--drain_seconds=5", *extra,
    ]  # fmt: skip
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
        **thread_env(threads),
    }
    settings = {"command": " ".join(command[1:])}
    if tree != ROOT:
        settings["tree"] = str(tree)
    return Server(peer, None, command, port, (), env, settings)


def transformers_server(python: Path, folder: Path, threads: int, continuous: bool) -> Server:
    port = free_port()
    command = [
        str(python.parent / "transformers"), "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
        "--device", "cpu", "--log-level", "error",
        *(("--continuous-batching", *CB_FLAGS) if continuous else ("--no-continuous-batching",)),
    ]  # fmt: skip
    name = "transformers-serve-cb" if continuous else "transformers-serve"
    return Server(name, continuous, command, port, (), thread_env(threads), {"command": " ".join(command[1:])})


def wait_for_model(running: Running, model: str, timeout: float = 300) -> float:
    """Seconds from spawning until the server lists ``model`` on ``GET /v1/models``."""
    deadline = time.perf_counter() + timeout
    url = f"http://127.0.0.1:{running.server.port}/v1/models"
    while time.perf_counter() < deadline:
        running.check_running()
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                if any(entry["id"] == model for entry in json.loads(response.read())["data"]):
                    return time.perf_counter() - running.started
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{running.server.peer} did not list {model} in {timeout:.0f} s:\n{running.log()}")


def client(running: Running) -> Any:
    import openai

    url = f"http://127.0.0.1:{running.server.port}/v1"
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)


# ============================================================================================= generation
async def one_stream(
    openai_client: Any,
    model: str,
    prompt: str,
    max_tokens: int = MAX_TOKENS,
    on_chunk: Callable[[], None] | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    first = 0.0
    chunks = 0
    finish = None
    stream = await openai_client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter() - started
                chunks += 1
                if on_chunk is not None:
                    on_chunk()
            finish = choice.finish_reason or finish
    return {"started": started, "ttft": first, "chunks": chunks, "finish": finish}


async def chat_round(openai_client: Any, model: str, prompts: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    streams = await asyncio.gather(*(one_stream(openai_client, model, p) for p in prompts))
    wall = time.perf_counter() - started
    complete = [s for s in streams if s["finish"] == "length"]
    return {
        "seconds": wall,
        "tokens_per_second": MAX_TOKENS * len(complete) / wall,
        "ttft": [s["ttft"] for s in streams],
        "chunks": [s["chunks"] for s in streams],
        "unfinished": len(streams) - len(complete),
    }


async def sustained_round(
    openai_client: Any, model: str, prompts: list[str], streams: int, seconds: float, warmup: float, seed: int
) -> dict[str, Any]:
    """``streams`` streams kept going for ``warmup`` + ``seconds``: each sends its next request as soon as its last
    answer ends, ``max_tokens`` drawn from 32 to 96 (a mean of 64; answers of one length would keep every stream in
    step, all arriving at once each time, which no real load does). Tokens/s: the content chunks received in the
    measured window over its length; time to first token: every request sent in the window and answered."""
    rng = random.Random(seed)
    window = {"start": 0.0, "end": 0.0}
    tokens = [0]
    done: list[dict[str, Any]] = []

    def counted() -> None:
        if window["start"] <= time.perf_counter() < window["end"]:
            tokens[0] += 1

    async def stream(index: int) -> None:
        turn = 0
        while True:
            prompt = prompts[(index + turn * streams) % len(prompts)]
            turn += 1
            outcome = await one_stream(openai_client, model, prompt, rng.randint(32, 96), counted)
            if window["start"] <= outcome["started"] < window["end"]:
                done.append(outcome)

    began = time.perf_counter()
    window.update(start=began + warmup, end=began + warmup + seconds)
    tasks = [asyncio.create_task(stream(i)) for i in range(streams)]
    await asyncio.sleep(warmup + seconds)
    for task in tasks:  # the streams still open are closed (the server frees their slots at its next step)
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "tokens_per_second": tokens[0] / seconds,
        "ttft": [d["ttft"] for d in done if d["ttft"]],
        "requests": len(done),
        "unfinished": sum(d["finish"] != "length" for d in done),
    }


async def sustained_rounds(
    running: list[Running], names: dict[str, str], prompts: list[str], args: Any, log: Callable[[str], None]
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """:func:`sustained_round` at 1 stream and at 16 on every server, ``--rounds`` times, the order reversed every
    other round."""
    clients = {r.server.peer: client(r) for r in running}
    plan = [(r.server.peer, n) for r in running for n in (1, STREAMS)]
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {key: [] for key in plan}
    for index in range(args.rounds):
        for peer, n in plan if index % 2 == 0 else reversed(plan):
            outcome = await sustained_round(
                clients[peer], names[peer], prompts, n, args.sustained_seconds, 2.0, seed=index
            )
            measured[(peer, n)].append(outcome)
            p50 = 1000 * statistics.median(outcome["ttft"]) if outcome["ttft"] else float("nan")
            log(
                f"sustained round {index + 1}: {peer}, {n} streams: {outcome['tokens_per_second']:.0f} tokens/s, "
                f"time to first token p50 {p50:.1f} ms over {outcome['requests']} requests"
            )
    for openai_client in clients.values():
        await openai_client.close()
    return measured


def sustained_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {**rates_and_first_tokens(rounds), "requests": sum(r["requests"] for r in rounds)}


def rates_and_first_tokens(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median round's tokens/s, every round's, time to first token p50/p95 over every stream of every round."""
    ttft = [t for r in rounds for t in r["ttft"]]
    rates = sorted(r["tokens_per_second"] for r in rounds)
    return {
        "tokens_per_second": round(statistics.median(rates), 1),
        "rounds_tokens_per_second": [round(r, 1) for r in rates],
        "ttft_p50_ms": round(1000 * percentile(ttft, 50), 1),
        "ttft_p95_ms": round(1000 * percentile(ttft, 95), 1),
        "unfinished_answers": sum(r["unfinished"] for r in rounds),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def generation_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    chunks = [c for r in rounds for c in r["chunks"]]
    return {**rates_and_first_tokens(rounds), "content_chunks_per_answer": [min(chunks), max(chunks)]}


async def generation_rounds(
    running: list[Running], names: dict[str, str], prompts: list[str], rounds: int, log: Callable[[str], None]
) -> tuple[dict[tuple[str, int], list[dict[str, Any]]], dict[str, float]]:
    """Every server at 1 stream and at 16, ``rounds`` times, the order reversed every other round: each round's
    figures, and the CPU seconds each server used while the others were measured. One event loop, one client a
    server, for the whole run (the clients' connections stay open between rounds)."""
    clients = {r.server.peer: client(r) for r in running}
    for peer, openai_client in clients.items():
        await chat_round(openai_client, names[peer], prompts[:2])  # warm-up (the CB manager starts here)
    counts = (1, STREAMS)
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {(r.server.peer, n): [] for r in running for n in counts}
    idle_cpu = {r.server.peer: 0.0 for r in running}
    plan = [(r, n) for r in running for n in counts]
    for index in range(rounds):
        for each, n in plan if index % 2 == 0 else reversed(plan):
            peer = each.server.peer
            others = {r: process_cpu_seconds(r.proc.pid) for r in running if r is not each}
            outcome = await chat_round(clients[peer], names[peer], prompts[:n])
            measured[(peer, n)].append(outcome)
            for r, before in others.items():
                idle_cpu[r.server.peer] += process_cpu_seconds(r.proc.pid) - before
            log(f"round {index + 1}: {peer}, {n} streams: {outcome['tokens_per_second']:.0f} tokens/s")
    for openai_client in clients.values():
        await openai_client.close()
    return measured, idle_cpu


def measure_generation(args: Any, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    repository = work / "llm-models"
    folder = repository / "generator" / "1"
    folder.mkdir(parents=True)
    prompts = build_generator(folder)
    python = ensure_transformers_serve(args.venvs, log)
    servers = [workbench_server(repository, args.threads, *args.generation_server_flags)]
    if args.baseline_tree:
        servers.append(workbench_server(repository, args.threads, tree=args.baseline_tree, peer=BASELINE))
    servers += [transformers_server(python, folder, args.threads, cb) for cb in (True, False)]
    names = {s.peer: "generator" if s.peer.startswith("workbench") else str(folder) for s in servers}  # as listed
    running: list[Running] = []
    result: dict[str, Any] = {"servers": {}}
    try:
        for server in servers:
            running.append(Running(server, work / f"{server.peer}.log", None))
        for each in running:
            ready = wait_for_model(each, names[each.server.peer])
            log(f"{each.server.peer}: ready in {ready:.1f} s (pid {each.proc.pid})")
            result["servers"][each.server.peer] = {**each.server.settings, "ready_seconds": round(ready, 1)}
        measured, idle_cpu = asyncio.run(generation_rounds(running, names, prompts, args.rounds, log))
        # Sustained load: the one-at-a-time server is left out (at 16 streams its requests queue for seconds).
        steady = [r for r in running if r.server.peer != "transformers-serve"]
        sustained = asyncio.run(sustained_rounds(steady, names, prompts, args, log)) if args.sustained_seconds else {}
        for each in running:  # after the runs: every pool a server starts on demand is there by now
            result["servers"][each.server.peer]["os_threads"] = len(os.listdir(f"/proc/{each.proc.pid}/task"))
    finally:
        for each in running:
            each.stop()
    for (peer, n), rounds in measured.items():
        result["servers"][peer][str(n)] = generation_row(rounds)
    for peer, seconds in idle_cpu.items():
        result["servers"][peer]["cpu_seconds_while_others_measured"] = round(seconds, 2)
    ours = result["servers"]["workbench"]
    for peer in ("transformers-serve-cb", "transformers-serve", *((BASELINE,) if args.baseline_tree else ())):
        theirs = result["servers"][peer]
        result[f"workbench_over_{peer.replace('-', '_')}"] = {
            f"{what}_{n}": round(ours[str(n)][key] / theirs[str(n)][key], 2)
            for what, key in (("tokens_per_second", "tokens_per_second"), ("ttft_p50", "ttft_p50_ms"))
            for n in (1, STREAMS)
        }
    result["workbench_16_over_1_tokens_per_second"] = round(
        ours[str(STREAMS)]["tokens_per_second"] / ours["1"]["tokens_per_second"], 2
    )
    result["workbench_16_over_1_ttft_p50"] = round(ours[str(STREAMS)]["ttft_p50_ms"] / ours["1"]["ttft_p50_ms"], 2)
    if args.baseline_tree:
        base = result["servers"][BASELINE]
        result["baseline_16_over_1_tokens_per_second"] = round(
            base[str(STREAMS)]["tokens_per_second"] / base["1"]["tokens_per_second"], 2
        )
        result["baseline_16_over_1_ttft_p50"] = round(base[str(STREAMS)]["ttft_p50_ms"] / base["1"]["ttft_p50_ms"], 2)
    if sustained:
        steady_rows: dict[str, dict[str, Any]] = {}
        for (peer, n), measured_rounds in sustained.items():
            steady_rows.setdefault(peer, {})[str(n)] = sustained_row(measured_rounds)
        ours_steady = steady_rows["workbench"]
        result["sustained"] = {
            "what": f"{STREAMS} streams (and 1) kept busy for --sustained_seconds after 2 s, max_tokens 32 to 96",
            "seconds": args.sustained_seconds,
            "servers": steady_rows,
            "workbench_16_over_1_tokens_per_second": round(
                ours_steady[str(STREAMS)]["tokens_per_second"] / ours_steady["1"]["tokens_per_second"], 2
            ),
            "workbench_16_over_1_ttft_p50": round(
                ours_steady[str(STREAMS)]["ttft_p50_ms"] / ours_steady["1"]["ttft_p50_ms"], 2
            ),
        }
        for peer in steady_rows:
            if peer == BASELINE:
                base_steady = steady_rows[peer]
                result["sustained"]["baseline_16_over_1_tokens_per_second"] = round(
                    base_steady[str(STREAMS)]["tokens_per_second"] / base_steady["1"]["tokens_per_second"], 2
                )
                result["sustained"]["baseline_16_over_1_ttft_p50"] = round(
                    base_steady[str(STREAMS)]["ttft_p50_ms"] / base_steady["1"]["ttft_p50_ms"], 2
                )
            if peer != "workbench":
                result["sustained"][f"workbench_over_{peer.replace('-', '_')}"] = {
                    f"{what}_{n}": round(ours_steady[str(n)][key] / steady_rows[peer][str(n)][key], 2)
                    for what, key in (("tokens_per_second", "tokens_per_second"), ("ttft_p50", "ttft_p50_ms"))
                    for n in (1, STREAMS)
                }
    result["transformers_serve_versions"] = versions(python, REPORTED)
    return result


# ============================================================================================= embeddings
def embedding_sender(running: Running, library: str) -> tuple[Callable[[str], Any], Callable[[], Any]]:
    """(send one text, close) with ``library``'s client: the official ``openai`` package, or a bare ``aiohttp``
    session POSTing the body ``openai`` sends (base64 asked, as ``openai`` asks by default; not decoded), which
    costs the client less CPU on a machine the server shares."""
    if library == "openai":
        openai_client = client(running)

        async def send(text: str) -> None:
            await openai_client.embeddings.create(model="encoder", input=text)

        return send, openai_client.close
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = f"http://127.0.0.1:{running.server.port}/v1/embeddings"

    async def post(text: str) -> None:
        body = {"model": "encoder", "input": text, "encoding_format": "base64"}
        async with session.post(url, json=body) as response:
            response.raise_for_status()
            await response.read()

    return post, session.close


# wrk's Lua request: the connections POST the bodies in turn (peers.wrk_script_load adds the summary).
WRK_EMBEDDINGS = """
local bodies = {%s}
local next_body = 0
request = function()
  next_body = next_body %% #bodies + 1
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, bodies[next_body])
end
"""


def embedding_round_wrk(running: Running, texts: list[str], args: Any) -> dict[str, Any]:
    """:func:`embedding_round` with wrk as the 32 clients (compiled: a tenth of ``aiohttp``'s CPU a request or
    less), the connections POSTing the body ``openai`` sends for each text in turn."""
    url = f"http://127.0.0.1:{running.server.port}"
    bodies = [json.dumps({"model": "encoder", "input": t, "encoding_format": "base64"}) for t in texts]
    requests = WRK_EMBEDDINGS % ", ".join(f"[==[{b}]==]" for b in bodies)
    with tempfile.TemporaryDirectory(prefix="wrk-embeddings-") as folder:
        work = Path(folder)
        wrk_script_load(url, requests, EMBED_CLIENTS, max(1, round(args.warmup)), 1, work)
        before = server_counters(url, "encoder")
        pid = running.proc.pid
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = process_cpu_seconds(pid), loop_cpu_seconds(pid)
        result = wrk_script_load(url, requests, EMBED_CLIENTS, max(1, round(args.seconds)), 1, work)
        served_cpu, loop_cpu = process_cpu_seconds(pid) - cpu[0], loop_cpu_seconds(pid) - cpu[1]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = result["requests"] / result["requests_per_second"] if result["requests_per_second"] else args.seconds
    client_cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    examples, batches, failed = counters_since(url, "encoder", before)
    answered = max(1, result["requests"])
    return {
        "texts_per_second": result["requests_per_second"],
        "mean_batch": round(examples / batches, 2) if batches else None,
        "p50_ms": round(result["p50_ms"], 2),
        "p99_ms": round(result["p99_ms"], 2),
        "errors": result["errors"] + int(failed),
        "server_cpu_per_second": round(served_cpu / wall, 2),
        "client_cpu_per_second": round(client_cpu / wall, 2),
        "server_loop_cpu_ms_per_text": round(1000 * loop_cpu / answered, 3),
        "server_other_cpu_ms_per_text": round(1000 * (served_cpu - loop_cpu) / answered, 3),
    }


async def embedding_round(running: Running, texts: list[str], library: str, args: Any) -> dict[str, Any]:
    """32 clients, each sending one text after the other: ``--warmup`` s, then ``--seconds`` measured (texts/s,
    latency, the server's mean batch from its metrics, the server's and this client's CPU a second)."""
    url = f"http://127.0.0.1:{running.server.port}"
    send, close = embedding_sender(running, library)
    latencies: list[float] = []
    errors = [0]
    window = {"open": False, "done": False}
    cursor = iter(range(10**12))

    async def loop() -> None:
        while not window["done"]:
            text = texts[next(cursor) % len(texts)]
            began = time.perf_counter()
            try:
                await send(text)
            except Exception:  # noqa: BLE001 - counted; the load goes on
                errors[0] += window["open"] and not window["done"]
                await asyncio.sleep(0.01)
                continue
            if window["open"] and not window["done"]:
                latencies.append(time.perf_counter() - began)

    tasks = [asyncio.create_task(loop()) for _ in range(EMBED_CLIENTS)]
    await asyncio.sleep(args.warmup)
    before = server_counters(url, "encoder")
    pid = running.proc.pid
    cpu = process_cpu_seconds(pid), loop_cpu_seconds(pid), time.process_time()
    window["open"] = True
    started = time.perf_counter()
    await asyncio.sleep(args.seconds)
    window["done"] = True
    wall = time.perf_counter() - started
    served_cpu, loop_cpu = process_cpu_seconds(pid) - cpu[0], loop_cpu_seconds(pid) - cpu[1]
    client_cpu = time.process_time() - cpu[2]
    examples, batches, failed = counters_since(url, "encoder", before)
    await asyncio.gather(*tasks)
    await close()
    answered = max(1, len(latencies))
    return {
        "texts_per_second": round(len(latencies) / wall, 1),
        "mean_batch": round(examples / batches, 2) if batches else None,
        "p50_ms": round(1000 * percentile(latencies, 50), 2),
        "p99_ms": round(1000 * percentile(latencies, 99), 2),
        "errors": errors[0] + int(failed),
        "server_cpu_per_second": round(served_cpu / wall, 2),
        "client_cpu_per_second": round(client_cpu / wall, 2),
        # Where the server's CPU goes: its event loop (HTTP, the OpenAI frontend, queueing, answers) and the rest
        # (the inference thread's tokenizing, forward pass and pooling), a text each.
        "server_loop_cpu_ms_per_text": round(1000 * loop_cpu / answered, 3),
        "server_other_cpu_ms_per_text": round(1000 * (served_cpu - loop_cpu) / answered, 3),
    }


def in_process_rate(servable: Any, texts: list[str], batch: int, seconds: float) -> float:
    """Texts/s of the servable called as the batcher calls it: ``batch`` feeds of one text each a call."""
    import numpy as np

    signature = servable.signatures["serving_default"]
    feeds = [{"text": np.array([t.encode()], dtype=object)} for t in texts]
    outputs = list(signature.outputs)
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        first = (done // batch * batch) % (len(feeds) - batch)
        answers = servable.run_requests(signature, feeds[first : first + batch], outputs)
        if any(not isinstance(a, dict) for a in answers):
            raise RuntimeError(f"the in-process call failed: {answers}")
        done += batch
    return done / (time.perf_counter() - started)


def in_process_cpu_ms(servable: Any, texts: list[str], batch: int, calls: int = 20) -> float:
    """This thread's CPU a text for ``calls`` calls of ``batch`` texts (what the server's inference thread spends
    on them), in ms."""
    import numpy as np

    signature = servable.signatures["serving_default"]
    feeds = [{"text": np.array([t.encode()], dtype=object)} for t in texts[: batch * calls]]
    began = time.thread_time()
    for first in range(0, len(feeds), batch):
        servable.run_requests(signature, feeds[first : first + batch], list(signature.outputs))
    return 1000 * (time.thread_time() - began) / len(feeds)


def measure_embeddings(args: Any, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from workbench.platforms import huggingface
    from workbench.platforms.base import LoadPolicy

    repository = work / "embedding-models"
    folder = repository / "encoder" / "1"
    folder.mkdir(parents=True)
    texts = build_encoder(folder)
    (work / "batching.txt").write_text(BATCHING)
    (work / "monitoring.txt").write_text(MONITORING)
    flags = (
        "--enable_batching", f"--batching_parameters_file={work / 'batching.txt'}",
        f"--monitoring_config_file={work / 'monitoring.txt'}", *args.embedding_server_flags,
    )  # fmt: skip
    servers = [workbench_server(repository, args.threads, *flags)]
    if args.baseline_tree is not None:
        servers.append(workbench_server(repository, args.threads, *flags, tree=args.baseline_tree, peer=BASELINE))
    for server in servers:
        server.settings["batching_parameters"] = " ".join(BATCHING.split())
    servable = huggingface.load(
        "encoder", 1, str(folder), LoadPolicy(pytorch_device="cpu", pytorch_threads=args.threads)
    )
    runnings: list[Running] = []
    rows: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    ready: dict[str, float] = {}
    try:
        for server in servers:
            runnings.append(Running(server, work / f"{server.peer}-embeddings.log", None))
            ready[server.peer] = wait_for_model(runnings[-1], "encoder")
            log(f"{server.peer} (embeddings): ready in {ready[server.peer]:.1f} s (pid {runnings[-1].proc.pid})")
        in_process_rate(servable, texts, 8, 1.0)  # warm-up
        for index in range(args.rounds):
            for running in runnings if index % 2 == 0 else reversed(runnings):
                peer = running.server.peer
                for library in args.embedding_clients if index % 2 == 0 else reversed(args.embedding_clients):
                    if library == "wrk":
                        served = embedding_round_wrk(running, texts, args)
                    else:
                        served = asyncio.run(embedding_round(running, texts, library, args))
                    batch = max(1, round(served["mean_batch"] or 1))
                    rate = in_process_rate(servable, texts, batch, args.seconds)
                    own = {"batch": batch, "texts_per_second": round(rate, 1)}
                    own["cpu_ms_per_text"] = round(in_process_cpu_ms(servable, texts, batch), 3)
                    rows.setdefault((peer, library), []).append((served, own))
                    log(
                        f"round {index + 1}, {peer}, {library}: served {served['texts_per_second']:.0f} texts/s "
                        f"(mean batch {served['mean_batch']}), in-process at batch {batch}: {rate:.0f} texts/s"
                    )
        reference = {str(b): round(in_process_rate(servable, texts, b, args.seconds / 2), 1) for b in (1, 32)}
    finally:
        for running in runnings:
            running.stop()
        servable.close()
    result: dict[str, Any] = {
        "server": {**servers[0].settings, "ready_seconds": round(ready["workbench"], 1)},
        "clients": EMBED_CLIENTS,
        "in_process_texts_per_second_at_batch": reference,
    }
    for (peer, library), measured in rows.items():
        ratios = [served["texts_per_second"] / local["texts_per_second"] for served, local in measured]
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
        row = {
            "served": measured[middle][0],
            "in_process": measured[middle][1],
            "rounds_served_over_in_process": [round(r, 3) for r in ratios],
            "served_over_in_process": round(ratios[middle], 3),
        }
        if peer == BASELINE:
            result.setdefault("baseline", {"server": servers[1].settings})[library] = row
        else:
            result[library] = row
    for library in args.embedding_clients if args.baseline_tree is not None else ():
        pairs = zip(rows[("workbench", library)], rows[(BASELINE, library)], strict=True)
        result[library]["rounds_served_over_baseline"] = [
            round(ours["texts_per_second"] / theirs["texts_per_second"], 3) for (ours, _), (theirs, _) in pairs
        ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each measurement (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's intra-op threads in every server (1)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of each embedding measurement (8)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of embedding load before each (2)")
    parser.add_argument(
        "--parts", nargs="+", choices=("generation", "embeddings"), default=["generation", "embeddings"]
    )
    parser.add_argument(
        "--embedding_clients",
        nargs="+",
        choices=("openai", "aiohttp", "wrk"),
        default=None,
        help="the embedding clients: each measured in every round (default openai, aiohttp and wrk where installed)",
    )
    parser.add_argument(
        "--embedding_server_flags", nargs="*", default=[], metavar="FLAG",
        help="more flags for the embeddings' `workbench serve`, e.g. --embedding_server_flags=--model_runners=1",
    )  # fmt: skip
    parser.add_argument(
        "--generation_server_flags", nargs="*", default=[], metavar="FLAG",
        help="more flags for this checkout's generator `workbench serve` (not --baseline_tree's), e.g. "
        "--generation_server_flags=--max_batched_tokens=160",
    )  # fmt: skip
    parser.add_argument(
        "--sustained_seconds", type=float, default=10.0,
        help="seconds of each sustained-load generation measurement (10; 0 leaves it out)",
    )  # fmt: skip
    parser.add_argument("--venvs", type=Path, default=None, help="where the peers' venvs live (as peers.py)")
    parser.add_argument(
        "--baseline_tree", type=Path, default=None,
        help="another workbench checkout (e.g. a worktree of main) served beside this one as workbench-baseline, "
        "in every generation round: the ratios of a change, taken in the same minutes",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=None, help="results file (default benchmarks/results/llm_serving.json)"
    )
    args = parser.parse_args()
    if args.embedding_clients is None:
        args.embedding_clients = ["openai", "aiohttp", *(["wrk"] if shutil.which("wrk") else [])]
    elif "wrk" in args.embedding_clients and shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    args.venvs = (args.venvs or cache / "workbench-peers").expanduser().resolve()
    args.venvs.mkdir(parents=True, exist_ok=True)
    if args.baseline_tree is not None:
        args.baseline_tree = args.baseline_tree.expanduser().resolve()
    os.environ.update(thread_env(args.threads))  # this process's in-process rates: the servers' thread count
    began = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f} s] {message}", flush=True)

    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "torch_threads": args.threads,
        "rounds": args.rounds,
        "client": "openai.AsyncOpenAI, in this process",
        "versions": versions(Path(sys.executable), (*REPORTED, "numpy")),
        "workbench_commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    if args.baseline_tree is not None:
        results["baseline_tree"] = str(args.baseline_tree)
        results["baseline_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=args.baseline_tree, capture_output=True, text=True
        ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="workbench-llm-") as temporary:
        work = Path(temporary)
        if "generation" in args.parts:
            results["generation"] = {
                "model": "GPT-2, 4 layers, hidden 256, 4 heads, vocabulary 1000, random weights, no end token",
                "max_tokens": MAX_TOKENS,
                "streams": [1, STREAMS],
                **measure_generation(args, work, log),
            }
            results["load_average_after_generation"] = round(os.getloadavg()[0], 2)
        if "embeddings" in args.parts:
            results["embeddings"] = {
                "model": "BERT, 4 layers, hidden 256, 4 heads, intermediate 1024, vocabulary 1000, random weights",
                "seconds": args.seconds,
                **measure_embeddings(args, work, log),
            }
    results["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    path = save_results("llm_serving", results, args.out or "")
    print(json.dumps(results, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
