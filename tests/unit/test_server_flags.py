"""``workbench serve``'s flags, declared once (workbench.config.server_flags): each sets its ServerOptions field
with that field's type and default, and a child server's command line reads back as the options it was made from."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.config.options import ServerOptions
from workbench.config.serve_options import FlagError, resolve_model_runners, serve_options
from workbench.config.server_flags import FLAGS, serve_flag_words, serve_parser

# Fields no flag sets by itself: --host binds both ports, the token and the number of workers are resolved;
# `workbench consume` sets the last two (its own --output, and no ports).
DERIVED = {
    "rest_api_host", "grpc_host", "management_token", "num_workers", "model_runners", "consume_only", "async_output"
}  # fmt: skip


def test_every_option_is_a_flag_or_derived_from_one() -> None:
    set_by_flags = {flag.field for flag in FLAGS.values() if flag.field is not None}
    fields = {field.name for field in dataclasses.fields(ServerOptions)}
    assert set_by_flags | DERIVED == fields
    assert not set_by_flags & DERIVED


def test_the_flags_defaults_are_the_options_defaults() -> None:
    assert serve_options(["--model_repository=models"]) == ServerOptions(model_repository="models")


def test_a_flag_is_typed_by_its_option() -> None:
    args = serve_parser().parse_args(["--port=9000", "--drain_seconds=5", "--enable_batching", "--load_model=a"])
    assert (args.port, args.drain_seconds, args.enable_batching, args.load_model) == (9000, 5.0, True, ["a"])


def test_words_read_back_as_the_options_they_were_made_from() -> None:
    values = {
        "model_repository": "models",
        "port": 0,
        "rest_api_port": -1,
        "enable_batching": True,
        "enable_model_warmup": False,
        "response_cache_bytes": 1024,
        "response_cache_models": ["a", "b"],
        "server_name": "exp",
        "parent_pid": 42,
    }
    words = serve_flag_words(values)
    assert "--enable_batching" in words and "--enable_model_warmup=false" in words
    assert "--response_cache_models=a,b" in words
    options = serve_options(words)
    assert options.response_cache_models == ("a", "b")
    for name, value in values.items():
        if name != "response_cache_models":
            assert getattr(options, name) == value, name


def test_words_leave_out_defaults_unless_kept() -> None:
    assert serve_flag_words({"port": 8500, "num_workers": 1, "ssl_config_file": None}) == []
    assert serve_flag_words({"port": 8500, "host": "127.0.0.1"}, keep_defaults=True) == [
        "--port=8500",
        "--host=127.0.0.1",
    ]


def test_words_name_only_serves_flags() -> None:
    with pytest.raises(ValueError, match="workbench serve has no flag --rest_port"):
        serve_flag_words({"rest_port": 8501})


def test_serve_options_says_what_is_wrong() -> None:
    with pytest.raises(FlagError, match="did you mean --rest_api_port"):
        serve_options(["--model_repository=models", "--rest_api_prot=1"])
    with pytest.raises(FlagError, match="one embedded server is one process"):
        serve_options(["--model_repository=models", "--num_workers=2"])
    # Ray's proxy owns the ports: OpenAI's endpoints stay on the REST app rather than vanish for a port never opened.
    for port in ("8001", "-1"):
        with pytest.raises(FlagError, match=r"--openai_port: an embedded server \(a Ray Serve replica\)"):
            serve_options(["--model_repository=models", f"--openai_port={port}"])
    assert serve_options(["--model_repository=models", "--openai_port=0"]).openai_port == 0


def test_a_flag_knows_its_earlier_spellings() -> None:
    assert set(FLAGS["model_repository"].aliases) == {"repo", "repository"}
    assert FLAGS["rest_api_port"].aliases == ("rest_port",)
    assert serve_options(["--repo=models", "--rest_port=8501"]) == serve_options(
        ["--model_repository=models", "--rest_api_port=8501"]
    )


@pytest.mark.parametrize(
    ("value", "workers", "gpus", "runners"),
    [
        ("auto", 4, "0,1", 2),  # a runner per GPU
        ("auto", 4, "", 0),  # no GPU: shared-nothing workers
        ("auto", 1, "0", 0),  # one worker serves in one process
        ("in_process", 4, "0", 0),
        ("3", 1, "", 3),  # asked for: also with one worker, also without GPUs
    ],
)
def test_model_runners_are_one_per_gpu_by_default_and_as_many_as_asked(
    monkeypatch: pytest.MonkeyPatch, value: str, workers: int, gpus: str, runners: int
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    assert resolve_model_runners(value, workers) == runners


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_model_runners_refuses_what_is_not_a_count(value: str) -> None:
    with pytest.raises(ValueError, match="--model_runners"):
        resolve_model_runners(value, 2)
