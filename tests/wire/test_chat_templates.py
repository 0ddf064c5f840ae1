"""A Python text generator's chat template renders as transformers renders a tokenizer's (the same template, the
same messages, the same prompt), in a sandbox a template cannot leave, and a template Jinja cannot read fails the
version's load, naming the line."""

from __future__ import annotations

from pathlib import Path

import pytest
from text_models import CHATML, write_model

from tests import hf_models
from workbench.core.errors import Code, ServingError
from workbench.platforms import Loader
from workbench.platforms.base import LoadPolicy
from workbench.platforms.chat_templates import render_chat_template

# What the templates of the Hub use: a namespace carried across the loop, loop controls, tojson (no HTML escapes),
# dict(), whitespace control, {% generation %} blocks and a check that raises.
FEATURES = (
    "{%- set ns = namespace(turns=0, system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' %}{% set ns.system = m.content %}{% continue %}{% endif -%}"
    "{%- set ns.turns = ns.turns + 1 -%}"
    "{%- if ns.turns > 3 %}{% break %}{% endif %}\n"
    "[{{ ns.turns }}] {{ m.role }}: {{ m.content }} {{ dict(n=ns.turns, html='<b>&') | tojson }}\n"
    "{%- if m.role == 'assistant' %}{% generation %} (said){% endgeneration %}{% endif %}\n"
    "{%- endfor %}\n"
    "{%- if ns.system %}system was: {{ ns.system | upper }}{% endif %}\n"
    "{%- if add_generation_prompt %}<assistant>{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Who wrote the first program?  "},
    {"role": "assistant", "content": "Ada Lovelace."},
    {"role": "user", "content": "When?"},
    {"role": "assistant", "content": "1843."},
    {"role": "user", "content": "Left out: past three turns."},
]


@pytest.mark.parametrize("template", [hf_models.CHAT_TEMPLATE, CHATML, FEATURES], ids=["plain", "chatml", "features"])
def test_a_template_renders_as_transformers_renders_it(template: str) -> None:
    tokenizer = hf_models.chat_tokenizer()
    theirs = tokenizer.apply_chat_template(MESSAGES, chat_template=template, add_generation_prompt=True, tokenize=False)
    assert render_chat_template(template, MESSAGES, "m") == theirs


def test_a_template_refusing_the_messages_is_the_requests_error_in_its_words() -> None:
    with pytest.raises(ServingError) as refused:
        render_chat_template(CHATML, [{"role": "assistant", "content": "first"}], "Model t version 1")
    assert refused.value.code is Code.INVALID_ARGUMENT
    assert "its chat template refused the messages: Conversation roles must alternate" in refused.value.message


@pytest.mark.parametrize(
    "escape",
    [
        "{% set _ = messages.append({'role': 'user'}) %}",  # the immutable sandbox: no changing what it was given
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # no way to Python's internals
        "{% set ns = namespace() %}{% set ns._private = 1 %}",  # transformers' namespace rule
    ],
)
def test_a_template_cannot_leave_the_sandbox(escape: str) -> None:
    with pytest.raises(ServingError) as refused:
        render_chat_template(escape, MESSAGES, "m")
    assert refused.value.code is Code.INVALID_ARGUMENT


def test_a_template_jinja_cannot_read_fails_the_load_naming_the_line(tmp_path: Path) -> None:
    source = 'import workbench\n\nclass Broken(workbench.TextGenerator):\n    chat_template = "ok\\n{% if %}"\n'
    write_model(tmp_path, "broken", source)
    with pytest.raises(ServingError) as failed:
        Loader(LoadPolicy(allow_python=True))("broken", 1, str(tmp_path / "broken" / "1"), "python")
    assert failed.value.code is Code.INVALID_ARGUMENT
    assert "Broken" in failed.value.message and "chat_template, line 2" in failed.value.message
    write_model(tmp_path, "odd", "import workbench\n\nclass Odd(workbench.TextGenerator):\n    chat_template = 3\n")
    with pytest.raises(ServingError, match="chat_template must be a Jinja str, not int"):
        Loader(LoadPolicy(allow_python=True))("odd", 1, str(tmp_path / "odd" / "1"), "python")
