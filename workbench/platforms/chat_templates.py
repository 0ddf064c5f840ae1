"""Chat templates: a chat's messages made into one prompt by a Jinja template, as a Hugging Face tokenizer's
``chat_template`` makes them, for models that are not Hugging Face models (a Python :class:`TextGenerator`).

The template runs in the environment transformers renders a tokenizer's template in
(``transformers.utils.chat_template_utils``), rebuilt here so a Python model needs no transformers: Jinja's
immutable sandbox (a template is code, and may come from elsewhere), ``trim_blocks`` and ``lstrip_blocks``,
``{% break %}``/``{% continue %}``, ``{% generation %}`` blocks (rendered as they are), a ``tojson`` filter that
does not escape HTML, ``raise_exception(message)`` and ``strftime_now(format)``, and ``dict`` and ``namespace``
that reach no attribute beyond their data. A template written for a
tokenizer renders here as it renders there (a test compares the two), with ``messages`` and
``add_generation_prompt``; names it uses that the model does not give (``bos_token``, ``tools``) are undefined,
which Jinja renders as nothing.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workbench.core.errors import Code, ServingError, invalid_argument

if TYPE_CHECKING:
    import jinja2


@functools.cache
def _environment() -> jinja2.Environment:
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # pragma: no cover - a dependency of workbench's; only a broken install lacks it
        raise ServingError(Code.FAILED_PRECONDITION, "A chat template needs jinja2: pip install jinja2") from None

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's turns with it (to find their
        tokens); a prompt is only rendered here, so the block renders as its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.datetime.now().strftime(format)

    class TemplateDict:
        """``dict(...)`` in a template: a dict, without the type itself (no reaching its attributes)."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace(...)``: no underscore-prefixed names, the way to CPython's internals."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attributes = dict(*rest, **kwargs)
            for name in attributes:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: object) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
    """``source`` compiled (cached by its text); a template Jinja cannot read raises ServingError (INVALID_ARGUMENT)
    naming the line, so a model whose template is wrong fails its load."""
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"chat_template, line {exc.lineno}: {exc.message}") from None


def render_chat_template(source: str, messages: Sequence[Mapping[str, Any]], label: str) -> str:
    """The messages as the prompt ``source`` makes of them, ending where the assistant's turn starts
    (``add_generation_prompt``); a template that refuses them (``raise_exception``, a failed check) is the request's
    error (INVALID_ARGUMENT), as it is with a tokenizer's template."""
    import jinja2

    template = compile_chat_template(source)
    try:
        return template.render(messages=[dict(m) for m in messages], add_generation_prompt=True)
    except jinja2.TemplateError as exc:
        raise invalid_argument(f"{label}: its chat template refused the messages: {exc}") from None
