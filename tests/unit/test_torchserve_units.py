"""TorchServe archives without a server: manifests, version numbering, unpacking, and the handler's batch."""

from __future__ import annotations

import http.server
import itertools
import json
import sys
import threading
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from workbench.config.options import is_model_name
from workbench.core.errors import Code, ServingError
from workbench.platforms import torchserve_archives as model_archives
from workbench.platforms import torchserve_download
from workbench.platforms.base import LoadPolicy
from workbench.platforms.torchserve_archives import ArchiveError, parse_manifest
from workbench.runtime import archive_download

pytest.importorskip("torch")

from workbench.platforms import torchserve

BATCH_HANDLER = """
def handle(data, context):
    if data is None:  # the initialising call
        return None
    if any(row.get("body") == b"fail" for row in data):
        raise RuntimeError("the model broke")
    context.set_response_status(201, "made", idx=0)
    return [{"batch": len(data), "got": row["body"].decode()} for row in data]
"""


def mar(path: Path, model: dict[str, object], files: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": model}))
        for name, text in (files or {}).items():
            archive.writestr(name, text)
    return path


def test_manifest_fields_and_defaults() -> None:
    manifest = parse_manifest(
        json.dumps({"model": {"modelName": "m", "handler": "h.py", "serializedFile": "w.pt", "modelFile": "net.py"}}),
        "m.mar",
    )
    assert (manifest.model_name, manifest.model_version, manifest.handler) == ("m", "1.0", "h.py")
    assert (manifest.serialized_file, manifest.model_file, manifest.runtime) == ("w.pt", "net.py", "python")
    with pytest.raises(ArchiveError, match="names no handler"):
        parse_manifest(json.dumps({"model": {"modelName": "m"}}), "m.mar")
    with pytest.raises(ArchiveError, match="not valid JSON"):
        parse_manifest("{", "m.mar")


def test_versions_are_numbered_in_version_order(tmp_path: Path) -> None:
    for file, version in (("a.mar", "1.10"), ("b.mar", "1.2"), ("c.mar", "1.2"), ("d.mar", "0.9")):
        mar(tmp_path / file, {"modelName": "m", "modelVersion": version, "handler": "image_classifier"})
    (tmp_path / "junk.mar").write_bytes(b"not a zip")
    models = model_archives.store_models(tmp_path, is_model_name)
    assert set(models) == {"m", "junk"}
    versions = {
        n: model_archives.read_manifest(Path(models["m"]) / str(n)).model_version for n in (1, 2, 3)
    }  # c.mar repeats 1.2: b.mar (first by name) is served
    assert versions == {1: "0.9", 2: "1.2", 3: "1.10"}
    assert not (Path(models["m"]) / "4").exists()
    assert model_archives.find_archive("a.mar") == ("m", 3, "1.10")
    assert "cannot be read as a model archive" in model_archives.read_source(Path(models["junk"]) / "1")["error"]
    (tmp_path / "a.mar").unlink()
    model_archives.store_models(tmp_path, is_model_name)
    assert not (Path(models["m"]) / "3").exists()


def test_member_outside_the_folder_refuses_the_archive(tmp_path: Path) -> None:
    mar(tmp_path / "z.mar", {"modelName": "z", "handler": "image_classifier"}, {"../../escape.txt": "x"})
    models = model_archives.store_models(tmp_path, is_model_name)
    with pytest.raises(ServingError, match="outside its folder"):
        torchserve.load("z", 1, str(Path(models["z"]) / "1"), LoadPolicy(allow_python=True))
    assert not (tmp_path / "escape.txt").exists()


def test_handler_code_needs_the_python_opt_in(tmp_path: Path) -> None:
    mar(tmp_path / "b.mar", {"modelName": "b", "handler": "batch.py"}, {"batch.py": BATCH_HANDLER})
    folder = str(Path(model_archives.store_models(tmp_path, is_model_name)["b"]) / "1")
    with pytest.raises(ServingError) as refused:
        torchserve.load("b", 1, folder, LoadPolicy())
    assert refused.value.code == Code.FAILED_PRECONDITION and "--allow_python_models" in refused.value.message


def test_grouped_requests_reach_one_handle_call(tmp_path: Path) -> None:
    mar(tmp_path / "b.mar", {"modelName": "b", "handler": "batch.py"}, {"batch.py": BATCH_HANDLER})
    folder = str(Path(model_archives.store_models(tmp_path, is_model_name)["b"]) / "1")
    servable = torchserve.load("b", 1, folder, LoadPolicy(allow_python=True))
    try:
        signature = servable.signatures["serving_default"]
        feeds = [{"data": np.array([b"a", b"b"], object)}, {"data": np.array([b"c"], object)}]
        answers = servable.run_requests(signature, feeds, ["output", "status", "content_type"])
        first, second = answers
        assert isinstance(first, dict) and isinstance(second, dict)
        assert [json.loads(o) for o in first["output"]] == [{"batch": 3, "got": "a"}, {"batch": 3, "got": "b"}]
        assert json.loads(second["output"][0]) == {"batch": 3, "got": "c"}
        assert first["status"].tolist() == [201, 200] and first["content_type"][0] == b"application/json"
        with pytest.raises(ServingError) as failed:
            servable.run_requests(signature, [{"data": np.array([b"fail"], object)}], ["output"])
        assert failed.value.code == Code.UNAVAILABLE and "Prediction failed: RuntimeError" in failed.value.message
    finally:
        servable.close()


def test_answers_are_encoded_as_torchserve_encodes_them() -> None:
    assert torchserve.encode_answer(b"\x00raw") == b"\x00raw"
    assert torchserve.encode_answer("text") == b"text"
    assert torchserve.encode_answer({"a": [1]}) == json.dumps({"a": [1]}, indent=2).encode()
    assert torchserve.decode_input(b'{"a": 1}', "application/json") == {"a": 1}
    assert torchserve.decode_input(b"hi", "text/plain") == "hi"
    assert torchserve.decode_input(b"{", "application/json") == b"{"


LAZY_HANDLER = """
import importlib


class Lazy:
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        import model  # imported at request time, as many handlers do
        from helpers.text import shout

        again = importlib.import_module("model")  # importlib (and unpickling) take the same module
        return [{"answer": shout(model.ANSWER), "same": again is model} for _ in data]
"""


def test_archives_import_their_own_same_named_modules_lazily(tmp_path: Path) -> None:
    """Two archives, each with a handler.py, a model.py and a helpers package of its own, imported inside
    handle(): each finds its own, one process serving both (TorchServe gives each its own worker process)."""
    for name in ("first", "second"):
        files = {
            "handler.py": LAZY_HANDLER,
            "model.py": f"ANSWER = {name!r}\n",
            "helpers/__init__.py": "",
            "helpers/text.py": "from .case import upper\n\ndef shout(text):\n    return upper(text) + '!'\n",
            "helpers/case.py": "def upper(text):\n    return text.upper()\n",
        }
        mar(tmp_path / f"{name}.mar", {"modelName": name, "handler": "handler.py"}, files)
    models = model_archives.store_models(tmp_path, is_model_name)
    loaded = {n: torchserve.load(n, 1, str(Path(models[n]) / "1"), LoadPolicy(allow_python=True)) for n in models}
    packages = {servable._modules.package for servable in loaded.values()}
    try:
        assert "model" not in sys.modules and "handler" not in sys.modules  # nothing plain is left behind
        signature = loaded["first"].signatures["serving_default"]
        for _ in range(2):
            for name in ("second", "first"):
                (answer,) = loaded[name].run_requests(signature, [{"data": np.array([b"x"], object)}], ["output"])
                assert isinstance(answer, dict)
                assert json.loads(answer["output"][0]) == {"answer": name.upper() + "!", "same": True}
        assert "model" not in sys.modules and "helpers" not in sys.modules
    finally:
        for servable in loaded.values():
            servable.close()
    assert not [m for m in sys.modules if m.partition(".")[0] in packages]  # unloaded: the archives' modules go


def test_an_archive_unloads_while_other_threads_import(tmp_path: Path) -> None:
    """Unloading walks ``sys.modules`` and ``sys.path_importer_cache`` while other load threads import (another
    archive's handler, a framework): the walk must not fail when they add to them."""
    from workbench.platforms.torchserve_imports import ArchiveModules

    stop = threading.Event()
    names = [f"_workbench_test_import_{index}" for index in range(200)]
    rounds = itertools.count()

    def importing() -> None:  # what imports do to both dicts, as often as the thread can (and then undone)
        while not stop.is_set():
            for name in names:
                sys.modules[name] = types.ModuleType(name)
                sys.path_importer_cache[str(tmp_path / name)] = None
            for name in names:
                sys.modules.pop(name, None)
                sys.path_importer_cache.pop(str(tmp_path / name), None)
            next(rounds)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch inside nearly every walk
    thread = threading.Thread(target=importing, daemon=True)
    thread.start()
    try:
        for index in range(200):
            folder = tmp_path / f"archive{index}"
            folder.mkdir()
            ArchiveModules(folder).close()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(previous)
    assert next(rounds) > 1  # the other thread did import meanwhile


def test_an_archives_model_file_wins_over_a_same_named_module_the_process_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default handlers import the archive's modelFile by its plain name; a module of that name already in
    sys.modules (this suite's own tests/models.py is "models") must not be taken for it."""
    import torch

    source = "import torch\n\n\nclass Doubler(torch.nn.Module):\n    def forward(self, x):\n        return 2 * x\n"
    weights = tmp_path / "weights.pth"
    torch.save({}, weights)
    mar(
        tmp_path / "doubler.mar",
        {
            "modelName": "doubler",
            "modelFile": "models.py",
            "serializedFile": "weights.pth",
            "handler": "image_classifier",
        },
        {"models.py": source, "weights.pth": weights.read_bytes(), "index_to_name.json": "{}"},
    )
    weights.unlink()
    monkeypatch.setitem(sys.modules, "models", type(sys)("models"))  # a module of the same name, no model class
    folder = model_archives.store_models(tmp_path, is_model_name)["doubler"]
    servable = torchserve.load("doubler", 1, str(Path(folder) / "1"), LoadPolicy(allow_python=True))
    servable.close()


def _archive_bytes(tmp_path: Path) -> bytes:
    path = mar(tmp_path / "source.mar", {"modelName": "big", "handler": "batch.py"}, {"batch.py": BATCH_HANDLER})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("filler.bin", "x" * 5000)  # stored, not compressed: the archive is over 5000 bytes
    data = path.read_bytes()
    path.unlink()
    return data


class _Unsized(http.server.BaseHTTPRequestHandler):
    """Archives sent without a Content-Length (only counting their bytes finds one too large); junk.mar is none."""

    archive = b""

    def do_GET(self) -> None:  # http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>not found</html>" if self.path.endswith("junk.mar") else self.archive)

    def log_message(self, *args: object) -> None:
        pass


def test_downloads_are_size_limited_checked_and_never_half_written(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    _Unsized.archive = _archive_bytes(tmp_path)
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unsized)
    thread = threading.Thread(target=site.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{site.server_address[1]}/big.mar"
        with pytest.raises(archive_download.DownloadError) as refused:
            torchserve_download.download_archive(url, store, max_bytes=1000)
        assert refused.value.status == 413 and "larger than 1000 bytes" in refused.value.message
        assert list(store.iterdir()) == []  # neither the archive nor its temporary file
        with pytest.raises(archive_download.DownloadError) as junk:
            torchserve_download.download_archive(url.replace("big", "junk"), store, max_bytes=10000)
        assert junk.value.status == 400 and "is not a model archive" in junk.value.message
        assert list(store.iterdir()) == []
        assert torchserve_download.download_archive(url, store, max_bytes=10000) == "big.mar"
        assert (store / "big.mar").read_bytes() == _Unsized.archive and len(list(store.iterdir())) == 1
        with pytest.raises(archive_download.DownloadError, match="must end in the archive's file name"):
            torchserve_download.download_archive(url.replace("big.mar", "big.zip"), store, max_bytes=10000)
    finally:
        site.shutdown()
        site.server_close()


def test_allowed_urls_are_torchserves_patterns_and_bad_ones_are_refused_at_start() -> None:
    from workbench.config.serve_options import FlagError, serve_options

    default = archive_download.allowed_urls()
    for url in ("https://example.com/m.mar", "HTTP://Example.com/m.mar", "file:///models/m.mar"):
        archive_download.check_allowed(url, default)  # TorchServe's default: any file or web URL, case aside
    archive_download.check_allowed("s3://bucket/m.mar", default)  # another scheme: the registration refuses it
    with pytest.raises(archive_download.DownloadError) as refused:
        archive_download.check_allowed("https://example.com/m.mar", archive_download.allowed_urls("file://.*"))
    assert (refused.value.status, refused.value.kind) == (404, "ModelNotFoundException")
    assert refused.value.message == "Given URL https://example.com/m.mar does not match any allowed URL(s)"
    mine = archive_download.allowed_urls(r"https://models\.example\.com/.*, http://127\.0\.0\.1:\d+/ok/.*")
    archive_download.check_allowed("https://models.example.com/a/m.mar", mine)
    archive_download.check_allowed("http://127.0.0.1:8000/ok/m.mar", mine)
    for url in ("https://models.example.com.evil.net/m.mar", "http://127.0.0.1:8000/other/m.mar"):
        with pytest.raises(archive_download.DownloadError, match="does not match any allowed URL"):
            archive_download.check_allowed(url, mine)  # the whole URL must match, not a prefix of it
    options = serve_options(["--model_repository=m", r"--torchserve_allowed_urls=https://a\.example/.*"])
    assert options.torchserve_allowed_urls == r"https://a\.example/.*"
    with pytest.raises(FlagError, match="is not a regular expression"):
        serve_options(["--model_repository=m", "--torchserve_allowed_urls=https://(unclosed"])
