"""Text generation's Prometheus series, declared once: time to first token, time per output token, and tokens in and
out, per model version (vLLM's series, in workbench's names).

Tokens per second is ``rate(workbench_generation_tokens_total[1m])``; a model's mean time to first token is
``rate(workbench_time_to_first_token_seconds_sum[1m]) / rate(workbench_time_to_first_token_seconds_count[1m])``.
Every generation is recorded once, where every decoupled stream passes (:mod:`workbench.planes.generation_watch`,
which feeds the live charts' rolling stats from the same observation), whichever frontend it came through; the
OpenAI-compatible frontend records the tokens of the texts it embeds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# From a fast model's first piece (a few ms) to a long prompt's prefill on a CPU (tens of seconds).
_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PER_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GenerationMetrics:
    """The generation series of one registry (the server's :class:`~workbench.observability.metrics.ServingMetrics`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.first_token = Histogram(
            "workbench_time_to_first_token_seconds",
            "Time from a generation request's arrival to its first generated text, per model version.",
            ["model", "version"],
            buckets=_FIRST_TOKEN_BUCKETS,
            registry=registry,
        )
        self.per_output_token = Histogram(
            "workbench_time_per_output_token_seconds",
            "Mean time between output tokens of one generation, after the first (inter-token latency).",
            ["model", "version"],
            buckets=_PER_TOKEN_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "workbench_prompt_tokens",
            "Tokens of the prompts (and embedded texts) requests sent, per model version.",
            ["model", "version"],
            registry=registry,
        )
        self.generation_tokens = Counter(
            "workbench_generation_tokens",
            "Tokens generated, per model version (their rate is the tokens per second).",
            ["model", "version"],
            registry=registry,
        )

    def observe_first_token(self, model: str, version: int, seconds: float) -> None:
        self.first_token.labels(model, str(version)).observe(seconds)

    def observe_tokens(self, model: str, version: int, tokens: int) -> None:
        """``tokens`` more tokens generated (counted as they come, so that their rate is live)."""
        self.generation_tokens.labels(model, str(version)).inc(tokens)

    def observe_end(
        self, model: str, version: int, prompt_tokens: int, completion_tokens: int, decode_seconds: float
    ) -> None:
        """One generation ended: its prompt's tokens, and the time per output token from ``decode_seconds`` (its
        first token to its last) over its ``completion_tokens`` (already counted by :meth:`observe_tokens`)."""
        labels = (model, str(version))
        if prompt_tokens:
            self.prompt_tokens.labels(*labels).inc(prompt_tokens)
        if completion_tokens > 1:
            self.per_output_token.labels(*labels).observe(decode_seconds / (completion_tokens - 1))

    def observe_embedded(self, model: str, version: int, tokens: int) -> None:
        """Texts embedded: their tokens are tokens in."""
        if tokens:
            self.prompt_tokens.labels(model, str(version)).inc(tokens)
