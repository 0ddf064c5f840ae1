"""``workbench serve DIR`` and ``workbench mlserver start FOLDER [flags]``: how their words become serve's flags."""

from __future__ import annotations

import json

import pytest

from workbench.cli import build_parser
from workbench.cli.mlserver_command import model_control_flags, typed_serve_flags
from workbench.cli.serve_command import replace_positional, repository_of_folder


def test_serve_folder_is_the_model_repository():
    words = ["serve", "models", "--rest_api_port=9000"]
    args = build_parser("serve").parse_args(words)
    args.words = words
    repository_of_folder(args)
    assert args.model_repository == "models"
    assert args.words == ["serve", "--model_repository=models", "--rest_api_port=9000"]


def test_serve_folder_and_model_repository_together_are_refused():
    args = build_parser("serve").parse_args(["serve", "a", "--model_repository=b"])
    with pytest.raises(ValueError, match="not both"):
        repository_of_folder(args)


def test_a_flags_separate_value_is_not_the_folder():
    assert replace_positional(["--server_name", "m", "m"], "m", None) == ["--server_name", "m"]


def test_mlserver_start_passes_typed_flags_after_the_settings():
    words = ["mlserver", "start", ".", "--rest_api_port=9000", "--enable_batching"]
    args = build_parser("mlserver").parse_args(words)
    assert args.folder == "." and args.rest_api_port == 9000
    assert typed_serve_flags(words, ".") == ["--rest_api_port=9000", "--enable_batching"]


def test_mlserver_start_refuses_a_mistyped_flag_with_the_nearest(capsys):
    with pytest.raises(SystemExit):
        build_parser("mlserver").parse_args(["mlserver", "start", ".", "--rest_api_prot=9000"])
    assert "did you mean --rest_api_port" in capsys.readouterr().err


def test_mlservers_model_control_is_explicit_with_every_model_loaded(tmp_path):
    assert model_control_flags(str(tmp_path)) == ["--model_control_mode=explicit", "--load_model=*"]
    (tmp_path / "settings.json").write_text(json.dumps({"load_models_at_startup": False}))
    assert model_control_flags(str(tmp_path)) == ["--model_control_mode=explicit"]
