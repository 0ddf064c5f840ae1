"""Every code block of the README and the guide does what it says, page by page (tests/guide_blocks.py says how a
block names its check).

One test a page: its ``run`` blocks run in order against the page's fixture (one ``workbench serve`` a page at
most), its ``parse`` blocks are checked line by line, its ``same-as README`` blocks are compared with the README's.
A failure names the page and the line of the block.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dockerfile
import numpy as np
import pytest
import requests
import tomllib
import yaml
from guide_blocks import (
    EXPECT_HELPER,
    README,
    ROOT,
    SHOWN,
    Block,
    all_blocks,
    blocks,
    commands,
    page_settings,
    pages,
    unchecked,
    with_expectations,
)
from packaging.requirements import Requirement
from waiting import free_port, wait_until

BIN = Path(sys.executable).parent
# The README's sections whose blocks tests/system/test_readme.py runs.
README_RUN = ("A 30-second tour", "Headless")


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------------------------- the convention


def test_every_block_names_its_check() -> None:
    problems = [p for p in map(unchecked, all_blocks()) if p]
    assert not problems, "\n".join(problems)


def test_the_readme_keeps_its_blocks_where_its_test_runs_them() -> None:
    for block in blocks(README):
        if block.check == "run":
            assert block.section.startswith(README_RUN), f"{block.where}: test_readme.py runs only {README_RUN}"


def test_the_readme_links_into_the_guide_and_each_link_lands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert any(t.startswith("docs/") for t in local)
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"


# ------------------------------------------------------------------------------------------------ parse


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"]) | {"": project["dependencies"]}


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def _parse_workbench(words: list[str]) -> None:
    from workbench.cli import COMMANDS, build_parser

    assert words[0] in COMMANDS, f"no command `workbench {words[0]}`"
    try:
        build_parser(words[0]).parse_args(words)
    except SystemExit as exc:
        raise AssertionError(f"`workbench {' '.join(words)}` does not parse") from exc


def _parse_magic(line: str) -> None:
    from workbench.notebook.serve_subcommands import parse_arguments, split_line

    words = split_line(line.removeprefix("%serve"))
    parse_arguments(words[0], words[1:])


def _check_pip(words: list[str]) -> None:
    extras = _extras()
    for word in words[2:]:
        if word.startswith("-") or word.startswith("https://"):
            continue
        requirement = Requirement(word)
        if requirement.name == "torch":
            continue  # PyTorch's own CPU index: the install line the pytorch extra documents
        assert requirement.name == "workbench-serving", f"pip installs {word}, not workbench-serving"
        unknown = requirement.extras - set(extras)
        assert not unknown, f"{word}: pyproject.toml declares no extra {sorted(unknown)}"


def _check_repository_file(path: str) -> None:
    found = ROOT / path
    assert found.exists(), f"{path} is not in the repository"
    files = sorted(found.rglob("*.yaml")) if found.is_dir() else [found]
    for file in files:
        if file.suffix in {".yaml", ".yml"}:
            assert list(yaml.safe_load_all(file.read_text())), f"{file} holds no YAML document"


def _check_docker(words: list[str]) -> None:
    if words[1] == "build":
        dockerfile_path = words[words.index("-f") + 1]
        assert dockerfile.parse_file(str(ROOT / dockerfile_path)), dockerfile_path
    elif words[1] == "run":
        # The image is the first word that is no option nor an option's value.
        i = 2
        while words[i].startswith("-"):
            i += 1 if "=" in words[i] or words[i] in {"--rm", "-d", "-it"} else 2
        image, flags = words[i], words[i + 1 :]
        for j, word in enumerate(words[:i]):
            if word == "-p":
                assert re.fullmatch(r"\d+:\d+", words[j + 1]), f"a port mapping: {words[j + 1]}"
        if image == "workbench-serving":  # deploy/Dockerfile's entry point hands the flags to `workbench serve`
            _parse_workbench(["serve", *flags])
        else:  # another project's image (Jaeger's): a well-formed reference, run without arguments
            assert re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::[\w.-]+)?", image) and not flags, words
    else:
        raise AssertionError(f"no check for `docker {words[1]}`")


def _check_curl(words: list[str]) -> None:
    body = next((words[i + 1] for i, w in enumerate(words) if w in {"-d", "--data"}), None)
    if body is not None:
        json.loads(body)
    assert any(re.match(r"(https?://)?[\w.-]+:\d+/", w) for w in words), f"curl names no URL: {words}"


def check_command(line: str) -> None:
    """One command line of a ``parse`` block, checked for real (an unknown command fails)."""
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    program = words[0]
    if program == "workbench":
        _parse_workbench(words[1:])
    elif program == "pip":
        _check_pip(words)
    elif program == "make":
        assert set(words[1:]) <= _make_targets(), f"the Makefile has no target {words[1:]}"
    elif program == "kubectl":
        path = words[words.index("-f" if "-f" in words else "-k") + 1]
        _check_repository_file(path)
    elif program == "docker":
        _check_docker(words)
    elif program == "curl":
        _check_curl(words)
    elif program == "export":  # an environment variable for the commands after it
        assert re.fullmatch(r"[A-Z_]+=.+", words[1]), line
    elif program == "uv" and words[1:3] == ["pip", "install"]:  # another package, into a folder of its own
        assert "--target" in words, f"uv installs into the environment itself: {line}"
        skipped = {words.index("--target") + 1}
        for i, word in enumerate(words[3:], start=3):
            if not word.startswith("-") and i not in skipped:
                Requirement(word)  # well-formed, pinned where the page pins it
    elif program == "python":  # the project's own scripts and test files
        paths = words[3:] if words[1:3] == ["-m", "pytest"] else words[1:2]
        for path in paths:
            assert (ROOT / path).exists(), f"{path} is not in the repository"
    else:
        raise AssertionError(f"no check for `{program}`: run the block, or teach check_command this command")


def check_python(block: Block) -> None:
    """Compiles (magic lines by the magic's parser) and resolves every ``workbench.…`` name it uses."""
    python_lines = []
    for line in block.code.splitlines():
        if line.startswith("%serve"):
            _parse_magic(line)
            python_lines.append("")
        else:
            python_lines.append(line)
    compile("\n".join(python_lines), block.where, "exec")
    for dotted in set(re.findall(r"\bworkbench(?:\.\w+)+", block.code)):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attribute in parts[cut:]:
                found = getattr(found, attribute)
            break


def check_parse(block: Block) -> None:
    if block.language == "python":
        check_python(block)
        return
    for line in commands(block.code):
        check_command(line)


# ------------------------------------------------------------------------------------------------- run


class Page:
    """A page's fixture: a folder, maybe a server, the namespace its Python blocks share."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.folder = folder
        self.monkeypatch = monkeypatch  # the process's environment, as a setup changes it, restored after the page
        # TF Serving's ports and TorchServe's, as the pages write them, swapped for free ones.
        self.ports = {default: str(free_port()) for default in ("8500", "8501", "8080")}
        self.namespace: dict[str, Any] = {}
        self.env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
        self.cleanups: list[Callable[[], object]] = []

    @contextmanager
    def inside(self) -> Iterator[None]:
        """In the page's folder, where its blocks write (``workbench-models``, outputs)."""
        cwd = os.getcwd()
        os.chdir(self.folder)
        try:
            yield
        finally:
            os.chdir(cwd)

    def ported(self, text: str) -> str:
        for default, port in self.ports.items():
            text = text.replace(default, port)
        return text

    def run_python(self, block: Block) -> None:
        code = self.ported(block.code)
        with self.inside():
            if re.search(r"^%", code, re.MULTILINE):  # magics: in the page's IPython shell (setup=ipython)
                result = self.namespace["__shell__"].run_cell(code)
                assert result.success, f"{block.where}: {result.error_before_exec or result.error_in_exec}"
            else:
                exec(EXPECT_HELPER + with_expectations(code), self.namespace)  # noqa: S102

    def run_bash(self, block: Block) -> None:
        """The block's commands in order, as a script (``set -e``; curl fails on an HTTP error). A ``workbench serve``
        line starts its server in the background, on free ports, and the next lines run once it is ready."""
        chunk: list[str] = []
        for command in commands(self.ported(block.code)):
            if command.startswith("workbench serve"):
                self._script(block, chunk)
                chunk = []
                self._serve(block, command)
            else:
                chunk.append(command)
        self._script(block, chunk)

    def _script(self, block: Block, lines: list[str]) -> None:
        if not lines:
            return
        prelude = 'set -euo pipefail\ncurl() { command curl --fail-with-body --silent --show-error "$@"; }\n'
        done = subprocess.run(
            ["bash", "-c", prelude + "\n".join(lines)], cwd=self.folder, env=self.env, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, f"{block.where} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    def _serve(self, block: Block, command: str) -> None:
        words = shlex.split(command)
        if not any(w.startswith("--port") for w in words):  # gRPC's default port may be taken here
            words.append(f"--port={self.ports['8500']}")
        rest_port = next(w.split("=", 1)[1] for w in words if w.startswith("--rest_api_port="))
        self.cleanups.append(_background(words, self.folder, self.env, rest_port, block.where))


def _background(words: list[str], folder: Path, env: dict[str, str], rest_port: str, where: str) -> Callable[[], None]:
    """``workbench serve`` started in the background, waited for until ready; returns what stops it."""
    log = folder / f"serve-{rest_port}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            words, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop() -> None:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)

    def ready() -> bool:
        assert server.poll() is None, f"{where}: the server exited\n{log.read_text()[-3000:]}"
        # Over https (--rest_api_ssl_cert_file), trusting the CA the page's setup wrote beside it.
        tls = any(w.startswith("--rest_api_ssl_cert_file") for w in words)
        url = f"{'https' if tls else 'http'}://127.0.0.1:{rest_port}/readyz"
        return requests.get(url, timeout=5, verify=str(folder / "ca.pem") if tls else True).status_code == 200

    try:
        wait_until(ready, timeout=300, what=f"{where}'s workbench serve")
    except BaseException:
        stop()
        raise
    return stop


@contextmanager
def demo_server(page: Page) -> Iterator[None]:
    """``workbench demo`` served by ``workbench serve`` with batching, as Getting started serves it."""
    made = subprocess.run(
        [BIN / "workbench", "demo", "models"], cwd=page.folder, env=page.env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    command = (
        "workbench serve --port=8500 --rest_api_port=8501 --model_config_file=models/models.config --enable_batching"
    )
    stop = _background(shlex.split(page.ported(command)), page.folder, page.env, page.ports["8501"], "the page")
    try:
        yield
    finally:
        stop()


def _digit_rows(page: Page) -> None:
    """``x``: three rows of scikit-learn's digits as the demo's digits model takes them, and ``digits.csv``."""
    from sklearn.datasets import load_digits

    pixels = (load_digits().data / 16).astype("float32")
    page.namespace.update(x=pixels[:3], workbench=importlib.import_module("workbench"))  # as after the tour
    header = ",".join(f"p{i}" for i in range(64))
    np.savetxt(page.folder / "digits.csv", pixels[:40], delimiter=",", header=header, comments="", fmt="%.4f")


def _canary(page: Page) -> None:
    """half_plus_two's v2 as its canary, so that the label ``canary`` names a version."""
    rest = f"http://127.0.0.1:{page.ports['8501']}"
    answer = requests.post(
        f"{rest}/workbench/v1/models/half_plus_two:canary", json={"version": 2, "weight": 0.1}, timeout=60
    )
    assert answer.status_code == 200, answer.text


def _repository(page: Page) -> None:
    """``workbench-models``, the notebook's default repository, holding the demo models (digits among them)."""
    made = subprocess.run(
        [BIN / "workbench", "demo", "workbench-models"], cwd=page.folder, env=page.env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]


def _tabular(page: Page) -> None:
    """Platforms' names: a scikit-learn pipeline, an XGBoost classifier and an ONNX model trained on the digits, ``x``
    (float64 rows, as scikit-learn computes), and ``server``, a notebook server on ``workbench-models``."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from xgboost import XGBClassifier

    import workbench

    digits = load_digits()
    x, y = digits.data / 16, digits.target
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=200)).fit(x, y)
    xgb_classifier = XGBClassifier(n_estimators=4, max_depth=2).fit(x, y)
    onnx_model_proto = to_onnx(LogisticRegression(max_iter=200).fit(x, y), x[:1].astype("float32"),
                               options={"zipmap": False})  # fmt: skip
    with page.inside():
        server = workbench.serve()
    page.cleanups.append(server.stop)
    page.namespace.update(
        workbench=workbench, x=x, sklearn_pipeline=pipeline, xgb_classifier=xgb_classifier,
        onnx_model_proto=onnx_model_proto, server=server,
    )  # fmt: skip


# A stand-in for resnet-18 (no network here for torchvision's weights): a handler that names the image's size.
IMAGE_HANDLER = """
import io
from PIL import Image

def handle(data, context):
    if data is None:  # the initialising call
        return None
    version = context.manifest["model"]["modelVersion"]
    return [{"tabby": 0.9, "size": list(Image.open(io.BytesIO(row.get("data") or row.get("body"))).size),
             "version": version} for row in data]
"""


def _torchserve_store(page: Page) -> None:
    """``model_store`` with resnet-18 1.0 and 2.0 (.mar archives of a custom handler), ``kitten.jpg`` and its bytes."""
    from model_archives import write_mar
    from PIL import Image

    store = page.folder / "model_store"
    store.mkdir()
    for version in ("1.0", "2.0"):
        manifest = {"modelName": "resnet-18", "modelVersion": version, "handler": "classify.py"}
        write_mar(store / f"resnet-18_{version}.mar", manifest, {"classify.py": IMAGE_HANDLER})
    Image.new("RGB", (32, 24), (200, 120, 40)).save(page.folder / "kitten.jpg")
    page.namespace["image_bytes"] = (page.folder / "kitten.jpg").read_bytes()


def _digit_tensors(page: Page) -> None:
    """``x_train``: scikit-learn's digits as float32 rows, what PyTorch's page trains on."""
    from sklearn.datasets import load_digits

    page.namespace["x_train"] = (load_digits().data / 16).astype("float32")


def _churn(page: Page) -> None:
    """A churn classifier on three features (``model``, ``X_train``, ``X_test``) and a digits classifier on 64 floats
    (``rows``), trees (no background needed), both exported; ``server`` (a notebook server on the page's ports) and
    its ``client``."""
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier

    import workbench

    rng = np.random.default_rng(7)
    features = np.column_stack([rng.uniform(0, 1, 400), rng.integers(1, 60, 400), rng.uniform(0, 2, 400)])
    churned = (features[:, 0] + features[:, 2] / 2 > 0.9).astype(int)
    model = RandomForestClassifier(n_estimators=20, max_depth=4, random_state=0).fit(features, churned)
    digits = load_digits()
    digits_model = RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0)
    digits_model.fit(digits.data / 16, digits.target)
    with page.inside():
        server = workbench.serve(port=int(page.ports["8500"]), rest_api_port=int(page.ports["8501"]))
        page.cleanups.append(server.stop)
        for name, served in (("churn", model), ("digits", digits_model)):
            exported = workbench.export(served, name, model_repository=server.model_repository)
            server.wait_for_version(name, exported.version)
    page.namespace.update(
        workbench=workbench, model=model, X_train=features[:300], X_test=features[300:], rows=digits.data[:1] / 16,
        server=server, client=server.client,
    )  # fmt: skip


# Built and exported in a process of its own: in this one, a batch job's engine has loaded TensorFlow's SavedModel
# runtime without its Python API, and `import keras` after that fails (a circular import inside TensorFlow).
CNN_EXPORT = """
import sys, keras, workbench
cnn = keras.Sequential([
    keras.Input((8, 8, 1), name="image"), keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.Flatten(),
    keras.layers.Dense(10, activation="softmax"),
])
print(workbench.export(cnn, "digits-cnn", model_repository=sys.argv[1]).version)
"""


def _cnn(page: Page) -> None:
    """``digits-cnn``, an (untrained) Keras CNN on the digits' 8x8 images, exported to the page's server, and
    ``images``."""
    from sklearn.datasets import load_digits

    server = page.namespace["server"]
    exported = subprocess.run(
        [sys.executable, "-c", CNN_EXPORT, str(server.model_repository)], cwd=page.folder, env=page.env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    server.wait_for_version("digits-cnn", int(exported.stdout.split()[-1]))
    page.namespace["images"] = (load_digits().images / 16).astype("float32")[..., None]


def _client(page: Page) -> None:
    """``client``, the notebook's Client on the page's server."""
    import workbench

    page.namespace["client"] = workbench.Client(f"http://127.0.0.1:{page.ports['8501']}")


def _tls(page: Page) -> None:
    """``models`` (the demo's), and a test CA's files: ``ca.pem``, ``server.pem`` and ``server.key`` for 127.0.0.1
    and localhost, and ``ssl.config``, TF Serving's SSLConfig holding the same PEM text for gRPC."""
    import trustme
    from google.protobuf import text_format

    import workbench.runtime.tensorflow_protos  # noqa: F401  # TF Serving's protos, without TensorFlow
    from workbench.config.tf_serving_protos import SSLConfig

    made = subprocess.run(
        [BIN / "workbench", "demo", "models"], cwd=page.folder, env=page.env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    chain = b"".join(blob.bytes() for blob in server.cert_chain_pems)
    (page.folder / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (page.folder / "server.pem").write_bytes(chain)
    (page.folder / "server.key").write_bytes(server.private_key_pem.bytes())
    config = SSLConfig(server_key=server.private_key_pem.bytes().decode(), server_cert=chain.decode())
    (page.folder / "ssl.config").write_text(text_format.MessageToString(config))


def _ipython(page: Page) -> None:
    """An IPython shell with ``%load_ext workbench`` and a ``%serve start`` server, for the page's magics."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    with page.inside():
        for line in ("%load_ext workbench", "%serve start"):
            result = shell.run_cell(line)
            assert result.success, f"{line}: {result.error_before_exec or result.error_in_exec}"
    page.cleanups.append(lambda: shell.run_cell("%serve stop --all"))
    page.namespace["__shell__"] = shell


def _s3(page: Page) -> None:
    """S3 on 127.0.0.1 (moto's server, through the standard AWS variables that servers started here inherit) with
    the bucket ``my-bucket``, ``workbench``, and ``model``, a scikit-learn classifier of the digits."""
    import boto3
    from moto_aws import moto_aws
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    aws = moto_aws(page.monkeypatch)
    aws.__enter__()
    page.cleanups.append(lambda: aws.__exit__(None, None, None))
    page.env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    boto3.client("s3").create_bucket(Bucket="my-bucket")
    digits = load_digits()
    page.namespace["model"] = LogisticRegression(max_iter=300).fit(digits.data / 16, digits.target)
    page.namespace["workbench"] = importlib.import_module("workbench")


SETUPS: dict[str, Callable[[Page], None]] = {
    "s3": _s3,
    "ipython": _ipython,
    "tls": _tls,
    "cnn": _cnn,
    "client": _client,
    "torchserve-store": _torchserve_store,
    "digit-tensors": _digit_tensors,
    "churn": _churn,
    "digits": _digit_rows, "canary": _canary, "repository": _repository, "tabular": _tabular,
}  # fmt: skip


def _manifests(page: Page) -> None:
    """What the page's ``workbench manifests`` wrote validates: Kubernetes' own kinds against its schemas (strict),
    KServe's against its CRD schemas where they are (tests/system/test_deploy.py's), else by group and kind."""
    import kubernetes_validate

    written = sorted(page.folder.rglob("*.yaml"))
    assert written, "the page's commands wrote no manifest"
    schemas = ROOT.parent / "shared" / "testdata" / "kserve"
    for path in written:
        for document in yaml.safe_load_all(path.read_text()):
            group = document["apiVersion"].rpartition("/")[0]
            if group == "serving.kserve.io":
                assert document["kind"] in {"ClusterServingRuntime", "ServingRuntime", "InferenceService"}, path
                schema_file = schemas / f"{document['kind']}.schema.json"
                if schema_file.is_file():
                    import jsonschema

                    schema = json.loads(schema_file.read_text())["versions"][document["apiVersion"].split("/")[1]]
                    errors = list(jsonschema.Draft4Validator(schema).iter_errors(document))
                    assert not errors, f"{path}: {errors[0].message}"
            elif group == "kustomize.config.k8s.io":  # `kubectl apply -k`: every file it names is beside it
                missing = [name for name in document["resources"] if not (path.parent / name).is_file()]
                assert not missing, f"{path} names files that are not there: {missing}"
            else:
                kubernetes_validate.validate(document, "1.34.0", strict=True)


# Checks of what a page's blocks made, after they ran: ``<!-- guide: page after=NAME -->``.
def _bucket_served(page: Page) -> None:
    """The notebook server the page started on the bucket serves the version the page exported there."""
    page.namespace["server"].wait_for_version("digits", 1)


AFTER: dict[str, Callable[[Page], None]] = {"manifests": _manifests, "bucket-served": _bucket_served}


def _guide_pages() -> list[Path]:
    return [p for p in pages() if any(b.language not in SHOWN or b.language == "json" for b in blocks(p))]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", _guide_pages(), ids=_page_id)
def test_the_page_s_blocks_do_what_they_say(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page_blocks = blocks(path)
    readme = [b.code for b in blocks(README)]
    for block in page_blocks:
        if block.language == "json":
            json.loads(block.code)  # shown, so it must be what it says: JSON
        elif block.check == "same-as":
            assert block.argument == "README", block.where
            assert block.code in readme, f"{block.where} is no longer the README's block"
        elif block.check == "parse":
            check_parse(block)
    runs = [b for b in page_blocks if b.check == "run" and path != README]
    if not runs:
        return
    settings = page_settings(path)
    page = Page(tmp_path, monkeypatch)
    server = demo_server(page) if settings.get("server") == "demo" else _nothing()
    with server:
        try:
            for name in filter(None, settings.get("setup", "").split(",")):
                SETUPS[name](page)
            for block in runs:
                if block.language == "python":
                    page.run_python(block)
                else:
                    page.run_bash(block)
            for name in filter(None, settings.get("after", "").split(",")):
                AFTER[name](page)
        finally:
            from workbench.notebook.handle import ServerHandle

            for value in page.namespace.values():  # servers the page's own blocks started
                if isinstance(value, ServerHandle):
                    value.stop()
            for cleanup in reversed(page.cleanups):
                cleanup()


@contextmanager
def _nothing() -> Iterator[None]:
    yield
