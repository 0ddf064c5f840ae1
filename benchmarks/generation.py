"""Continuous batching of text generation: tokens/s and time to first token at 1 and 16 concurrent streams.

Run: `.venv/bin/python benchmarks/generation.py` (a few minutes on 2 cores). Writes benchmarks/results/generation.json.

The generator is built here: a GPT-2 of 4 layers, hidden size 256, random weights, a byte-level BPE tokenizer of
1,000 tokens trained on the spot, saved as a `save_pretrained` folder and loaded with
`workbench.platforms.huggingface_generation.load`, as the Hugging Face platform loads it. Each stream is a thread
that sends its request as the data plane does (`run_decoupled`) and reads its responses (streamed, a response a
step) until the last: greedy, 64 new tokens, a prompt of about 24 tokens, each stream its own prompt. A round starts
all its streams at once; tokens/s is the round's new tokens over its wall time, time to first token is each
stream's from its request to its first response (median and worst of the round). Rounds of 1 and of 16 streams
alternate (`--rounds` each), so a burst of other work on a shared machine falls on both; the medians are reported.

Beside it, on the same model: `model.generate` one request after another (what serving without batching gives), and
transformers' own `ContinuousBatchingManager` (`init_continuous_batching`, streaming, greedy), at the same stream
counts: what the choice in docs/huggingface.md weighed. The machine's load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import save_results

NEW_TOKENS = 64
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "while", "a", "stitch", "in", "time", "saves",
    "nine", "and", "every", "cloud", "has", "silver", "lining", "so", "we", "read", "books", "about", "models",
    "serving", "tokens", "to", "notebooks", "evening", "light",
]  # fmt: skip


def build(folder: Path, chat_template: str | None = None) -> list[str]:
    """The generator's version folder (its tokenizer with ``chat_template`` where given), and one prompt per
    stream."""
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(400)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1000))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    if chat_template is not None:
        fast.chat_template = chat_template
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=len(fast), n_positions=512, bos_token_id=None, eos_token_id=None
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    (folder / "workbench.json").write_text(json.dumps({"platform": "huggingface", "task": "text-generation"}))
    return [" ".join(rng.choice(WORDS) for _ in range(16)) for _ in range(16)]


def workbench_round(servable: Any, prompts: list[str]) -> dict[str, float]:
    import numpy as np

    from workbench.core import text_generation as tg

    signature = servable.signatures["serving_default"]
    params = json.dumps({"temperature": 0, "max_tokens": NEW_TOKENS}).encode()
    first: list[float] = [0.0] * len(prompts)
    counts: list[int] = [0] * len(prompts)
    go = threading.Barrier(len(prompts) + 1)

    def stream(i: int) -> None:
        inputs = {
            tg.TEXT_INPUT: np.array([prompts[i].encode()], dtype=object),
            tg.STREAM: np.array([True]),
            tg.SAMPLING_PARAMETERS: np.array([params], dtype=object),
            tg.RETURN_NUM_OUTPUT_TOKENS: np.array([True]),
        }
        go.wait()
        started = time.perf_counter()
        for response in servable.run_decoupled(signature, inputs, list(signature.outputs)):
            if not first[i]:
                first[i] = time.perf_counter() - started
            counts[i] = int(response[tg.NUM_OUTPUT_TOKENS][0])

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    go.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return _figures(sum(counts), wall, first)


def generate_round(model: Any, tokenizer: Any, prompts: list[str]) -> dict[str, float]:
    """``model.generate`` one request after another: each waits for those before it."""
    import torch

    started = time.perf_counter()
    first = []
    tokens = 0
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
            )
            first.append(time.perf_counter() - started)  # no stream: the whole answer is its first token
            tokens += out.shape[1] - ids.shape[1]
    return _figures(tokens, time.perf_counter() - started, first)


def manager_round(manager: Any, tokenizer: Any, prompts: list[str]) -> dict[str, float]:
    """transformers' ContinuousBatchingManager, streaming: requests added at once, outputs read as they come."""
    started = time.perf_counter()
    ids = [manager.add_request(tokenizer(p)["input_ids"], max_new_tokens=NEW_TOKENS, streaming=True) for p in prompts]
    first: dict[str, float] = {}
    done: dict[str, int] = {}
    while len(done) < len(ids):
        result = manager.get_result(timeout=60)
        if result is None:
            raise RuntimeError("ContinuousBatchingManager gave no result in 60 s")
        first.setdefault(result.request_id, time.perf_counter() - started)
        if result.is_finished():
            done[result.request_id] = len(result.generated_tokens)
    return _figures(sum(done.values()), time.perf_counter() - started, list(first.values()))


def _figures(tokens: int, wall: float, first: list[float]) -> dict[str, float]:
    return {
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_second": tokens / wall,
        "ttft_median_ms": 1000 * statistics.median(first),
        "ttft_worst_ms": 1000 * max(first),
    }


def summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    keys = ("tokens_per_second", "ttft_median_ms", "ttft_worst_ms")
    return {k: round(statistics.median(r[k] for r in rounds), 2) for k in keys} | {"rounds": len(rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each stream count (default 5)")
    parser.add_argument(
        "--threads", type=int, default=1, help="PyTorch's intra-op threads (default 1, as --pytorch_threads)"
    )
    parser.add_argument("--streams", type=int, default=16, help="the concurrent stream count (default 16)")
    parser.add_argument("--device", default="cpu", help="--pytorch_device (default cpu)")
    parser.add_argument("--skip-baselines", action="store_true", help="only workbench's scheduler")
    parser.add_argument("--out", default="", help="results file (default benchmarks/results/generation.json)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers.utils import logging as transformers_logging

    from workbench.platforms import huggingface_generation as hg
    from workbench.platforms.base import LoadPolicy

    transformers_logging.set_verbosity_error()
    load_before = os.getloadavg()
    counts = (1, args.streams)
    results: dict[str, Any] = {
        "model": "GPT-2, 4 layers, hidden 256, 4 heads, vocabulary 1000, random weights",
        "new_tokens_per_stream": NEW_TOKENS,
        "torch_threads": args.threads,
        "device": args.device,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary, "generator", "1")
        prompts = build(folder)
        policy = LoadPolicy(pytorch_device=args.device, pytorch_threads=args.threads)
        servable = hg.load("generator", 1, str(folder), policy, hg.TEXT_GENERATION)
        try:
            workbench_round(servable, prompts[:2])  # warm-up
            rounds: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
            for i in range(args.rounds):
                for n in counts if i % 2 == 0 else reversed(counts):
                    rounds[n].append(workbench_round(servable, prompts[:n]))
            results["workbench"] = {str(n): summary(rounds[n]) for n in counts}
            model, tokenizer = servable.model, servable.tokenizer  # type: ignore[attr-defined]
        finally:
            servable.close()
        if not args.skip_baselines:
            generate_round(model, tokenizer, prompts[:1])  # warm-up
            baseline_rounds = max(1, args.rounds // 2)  # a round of 16 one after another is slow
            results["generate_one_at_a_time"] = {
                str(n): summary([generate_round(model, tokenizer, prompts[:n]) for _ in range(baseline_rounds)])
                for n in counts
            }
            results["transformers_continuous_batching"] = manager_figures(model, tokenizer, prompts, counts, args)
    ours = results["workbench"]
    one, many = ours["1"], ours[str(args.streams)]
    results["speedup_tokens_per_second"] = round(many["tokens_per_second"] / one["tokens_per_second"], 2)
    results["ttft_ratio_median"] = round(many["ttft_median_ms"] / one["ttft_median_ms"], 2)
    results["ttft_ratio_worst"] = round(many["ttft_worst_ms"] / one["ttft_median_ms"], 2)
    results["load_average_before_after"] = [round(x, 2) for x in (*load_before[:1], os.getloadavg()[0])]
    path = save_results("generation", results, args.out)
    print(json.dumps(results, indent=2))
    print(f"written to {path}")


def manager_figures(model: Any, tokenizer: Any, prompts: list[str], counts: tuple[int, ...], args: Any) -> Any:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0)
    batching = ContinuousBatchingConfig(num_blocks=256, page_size=32, max_batch_tokens=512)
    manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=batching)
    manager.start()
    try:
        manager_round(manager, tokenizer, prompts[:2])  # warm-up
        rounds: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
        for i in range(args.rounds):
            for n in counts if i % 2 == 0 else reversed(counts):
                rounds[n].append(manager_round(manager, tokenizer, prompts[:n]))
        return {str(n): summary(rounds[n]) for n in counts}
    finally:
        manager.stop(block=True, timeout=30)


if __name__ == "__main__":
    main()
