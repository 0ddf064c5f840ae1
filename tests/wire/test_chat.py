"""``%serve chat`` and the chat widget against a real server: a Python generator that follows the text generator
convention (workbench.core.text_generation) answers over the OpenAI-compatible endpoint, streamed into the cell."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from workbench.client.openai_chat import ChatAnswer
from workbench.notebook.chat_widget import ChatWidget
from workbench.notebook.handle import ServerHandle

# A workbench.TextGenerator that answers the last line of its prompt backwards, word by word ("user: big red ball" →
# "ball red big"); a system message shows as "[system]" first. A word is a token.
BACKWARDS = textwrap.dedent(
    """
    import workbench

    class Backwards(workbench.TextGenerator):
        def generate(self, prompt, params):
            lines = [line for line in prompt.splitlines() if line.startswith("user: ")]
            words = lines[-1][len("user: "):].split()[::-1]
            if "system: " in prompt:
                words.insert(0, "[system]")
            for i, word in enumerate(words):
                yield (" " if i else "") + word
    """
)


@pytest.fixture(scope="module")
def served(ipython_shell: InteractiveShell, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    repo: Path = tmp_path_factory.mktemp("chat-repo")
    (repo / "backwards" / "1").mkdir(parents=True)
    (repo / "backwards" / "1" / "model.py").write_text(BACKWARDS)
    handle = ipython_shell.run_line_magic("serve", f"start --repo {repo} --server_name chat --allow_python_models")
    try:
        handle.wait_for_version("backwards")
        yield handle
    finally:
        ipython_shell.run_line_magic("serve", "stop --server_name chat")


def chat(ip: InteractiveShell, line: str) -> Any:
    return ip.run_line_magic("serve", f"chat {line} --server_name chat")


def test_a_question_streams_its_answer_into_the_cell(
    ipython_shell: InteractiveShell, served: ServerHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = chat(ipython_shell, "backwards big red ball")
    assert isinstance(answer, ChatAnswer)
    assert answer.text == "ball red big"
    assert capsys.readouterr().out == "ball red big\n"  # printed piece by piece, then the line's end
    assert answer.finish_reason == "stop"
    assert answer.completion_tokens == 3
    assert answer.prompt_tokens is not None and answer.prompt_tokens > 0
    assert answer.first_token_seconds is not None and answer.first_token_seconds <= answer.seconds
    assert "3 tokens" in answer.summary()


def test_parameters_and_the_system_message_reach_the_model(
    ipython_shell: InteractiveShell, served: ServerHandle
) -> None:
    assert chat(ipython_shell, "backwards one two three --max_tokens 2").text == "three two"
    assert chat(ipython_shell, "backwards one two --system 'be brief'").text == "[system] two one"


def test_an_unknown_model_is_one_line_naming_it(ipython_shell: InteractiveShell, served: ServerHandle) -> None:
    with pytest.raises(UsageError, match="nosuch"):
        chat(ipython_shell, "nosuch hello")


def test_the_widget_keeps_the_conversation_and_says_how_fast_it_came(served: ServerHandle) -> None:
    widget = ChatWidget(served.client, "backwards")
    first = widget.send("alpha beta")
    assert first is not None and first.text == "beta alpha"
    second = widget.send("gamma delta")
    assert second is not None and second.text == "delta gamma"
    assert [m["role"] for m in widget.messages] == ["user", "assistant", "user", "assistant"]
    assert "beta alpha" in widget.transcript.value and "delta gamma" in widget.transcript.value
    assert "2 tokens" in widget.status.value
    widget.clear()
    assert widget.messages == [] and "No messages" in widget.transcript.value


def test_the_widget_shows_a_refusal_and_keeps_going(served: ServerHandle) -> None:
    widget = ChatWidget(served.client, "nosuch")
    assert widget.send("hello") is None
    assert "NOT_FOUND" in widget.status.value and widget.messages == []
    assert not widget.send_button.disabled
