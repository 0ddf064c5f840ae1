"""A chat with a served model in a cell: the conversation, a box to type in, and how fast each answer came.

What ``%serve chat MODEL`` shows. The answer streams into the transcript piece by piece (each piece is a widget
update sent while the request runs, so the cell shows it as it comes), over the server's OpenAI-compatible endpoint
(:meth:`workbench.client.Client.chat`). The conversation is kept in the widget: each question is sent with the
messages before it, as a chat client does.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets

from workbench.client import Client
from workbench.client.openai_chat import ChatAnswer
from workbench.core.errors import ServingError


class ChatWidget(widgets.VBox):  # type: ignore[misc]
    """Chat with ``model`` through ``client``; ``parameters`` (OpenAI's ``max_tokens``, ``temperature``...) go with
    every question; ``system`` opens the conversation as its system message."""

    def __init__(self, client: Client, model: str, system: str | None = None, **parameters: Any) -> None:
        self.client = client
        self.model = model
        self.parameters = parameters
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.answers: list[ChatAnswer] = []
        self.transcript = widgets.HTML(layout=widgets.Layout(max_height="360px", overflow="auto"))
        self.question = widgets.Textarea(
            placeholder=f"Ask {model}…", layout=widgets.Layout(width="100%", height="60px")
        )
        self.send_button = widgets.Button(description="Send", button_style="primary")
        self.clear_button = widgets.Button(description="New chat")
        self.status = widgets.HTML()
        self.send_button.on_click(lambda _: self.send())
        self.clear_button.on_click(lambda _: self.clear())
        super().__init__(
            [
                widgets.HTML(f"<b>{html.escape(model)}</b>"),
                self.transcript,
                self.question,
                widgets.HBox([self.send_button, self.clear_button]),
                self.status,
            ]
        )
        self._render()

    def send(self, text: str | None = None) -> ChatAnswer | None:
        """Ask ``text`` (else what the box holds); the answer streams into the transcript. None for an empty
        question or a refused one (the status line says why)."""
        question = (self.question.value if text is None else text).strip()
        if not question:
            return None
        self.question.value = ""
        self.messages.append({"role": "user", "content": question})
        streamed: list[str] = []

        def show(piece: str) -> None:
            streamed.append(piece)
            self._render(pending="".join(streamed))

        self.send_button.disabled = True
        self.status.value = "<i>answering…</i>"
        try:
            answer = self.client.chat(self.model, self.messages, on_piece=show, **self.parameters)
        except ServingError as exc:
            self.messages.pop()  # not answered: not part of the conversation
            refusal = html.escape(f"{exc.code.name}: {exc.message}")
            self.status.value = f"<span style='color:#b00'>{refusal}</span>"
            self._render()
            return None
        finally:
            self.send_button.disabled = False
        self.messages.append({"role": "assistant", "content": answer.text})
        self.answers.append(answer)
        self.status.value = html.escape(answer.summary())
        self._render()
        return answer

    def clear(self) -> None:
        """Start over (a system message stays)."""
        self.messages = [m for m in self.messages if m["role"] == "system"]
        self.answers.clear()
        self.status.value = ""
        self._render()

    def _render(self, pending: str | None = None) -> None:
        shown = [m for m in self.messages if m["role"] != "system"]
        rows = [_bubble(m) for m in shown]
        if pending is not None:
            rows.append(_bubble({"role": "assistant", "content": pending + "▌"}))
        self.transcript.value = "".join(rows) or "<i>No messages yet.</i>"


def _bubble(message: Mapping[str, str]) -> str:
    mine = message["role"] == "user"
    style = "text-align:right;background:#e8f0fe" if mine else "background:#f4f4f4"
    text = html.escape(message["content"])  # pre-wrap keeps its line breaks
    return f"<div style='margin:4px 0;padding:6px 10px;border-radius:8px;white-space:pre-wrap;{style}'>{text}</div>"
