"""One vocabulary for the command line, the ``%serve`` magics and the Python API.

Where TF Serving has a thing, its flag name is the name everywhere: ``rest_api_port``, ``port`` (gRPC),
``model_name``, ``enable_batching``, ``batching_parameters_file``, ``signature_name``. workbench's own things are
named in the same style: ``model_repository`` (Triton's name for a folder of model folders), ``server_name``,
``concurrency``. Earlier spellings stay accepted as aliases — options through :func:`canonical_options` (which
also reads dashes as underscores: ``--rest-api-port``), Python keywords through :func:`renamed_keywords`,
attributes through :class:`Alias` — but help, signatures and docs show only the names above.

The command line and the magics also share from here what makes their help and errors helpful: the help
formatter (defaults shown, booleans shown as flags), TF Serving's boolean flags (:class:`BoolFlag`), the
"did you mean" suggestion for a mistyped option, the parser that applies them all (:class:`VocabularyParser`) and
:class:`Argument`, an option declared once for every parser that takes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import sys
import textwrap
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

# Earlier or other spellings → the name. An alias applies only where the option it stands for exists, and never
# hides an option of its own spelling: ``--model_name`` stays ``serve``'s own flag, and means ``--model`` only
# for ``bench``, which has no ``--model_name``.
OPTION_ALIASES: Mapping[str, str] = {
    "rest_port": "rest_api_port",
    "grpc_port": "port",
    "repo": "model_repository",
    "repository": "model_repository",
    "server": "server_name",
    "batching": "enable_batching",
    "batching_parameters": "batching_parameters_file",
    "signature": "signature_name",
    "clients": "concurrency",
    "model_name": "model",
    "strict_model_config": "disable_auto_complete_config",  # Triton's earlier name of the same flag
    "use_tflite_model": "prefer_tflite_model",  # TF Serving's earlier name of the same flag
}

# ``workbench.serve`` / ``ServerHandle``'s earlier keyword names (their options' aliases, plus ``name``, which
# is too vague for a command line that also has ``--model_name``).
SERVER_KEYWORD_ALIASES: Mapping[str, str] = {
    "repository": "model_repository",
    "name": "server_name",
    "rest_port": "rest_api_port",
    "grpc_port": "port",
    "batching": "enable_batching",
    "batching_parameters": "batching_parameters_file",
    "poll_seconds": "file_system_poll_wait_seconds",
}

_TRUE = ("1", "true", "t", "yes", "y")
_FALSE = ("0", "false", "f", "no", "n")

F = TypeVar("F", bound=Callable[..., Any])


# ------------------------------------------------------------------------------------------------------ Python
def renamed_keywords(**renamed: str) -> Callable[[F], F]:
    """Accept earlier keyword names: ``@renamed_keywords(rest_port="rest_api_port")``.

    The signature (``help()``, ``inspect.signature``, completion) shows the new names only; an old name is
    passed on as the new one, and giving both is a TypeError, as Python's own duplicate keywords are.
    """

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def accepting_old_names(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__qualname__}() got both {new}= and its old name {old}=")
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        accepting_old_names.renamed_keywords = dict(renamed)  # type: ignore[attr-defined]
        return cast(F, accepting_old_names)

    return decorate


class Alias:
    """A class attribute that reads and writes another under an earlier name: ``name = Alias("server_name")``."""

    def __init__(self, canonical: str) -> None:
        self.canonical = canonical

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.canonical)

    def __set__(self, obj: object, value: Any) -> None:
        setattr(obj, self.canonical, value)


# ----------------------------------------------------------------------------------------------------- options
def parse_bool(text: str) -> bool:
    """TF Serving's boolean flag values (``true``/``false``, also 1/0 and yes/no, in any case)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class BoolFlag(argparse.Action):
    """A boolean flag in TF Serving's forms: ``--flag`` alone is true, ``--flag=true`` and ``--flag=false`` set it."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, default: bool = False, help: str | None = None
    ) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs="?",
            const=True,
            default=default,
            type=parse_bool,
            metavar="true|false",
            help=help,
        )

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        setattr(namespace, self.dest, values)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with every default that says something, booleans shown as flags, and examples kept as written.

    Defaults that say nothing (none, an empty text, a switch's false) are left out, so help texts can say in words
    what their absence means ("default: a free port"). In descriptions and epilogs, prose is wrapped to the
    terminal and indented lines (example command lines) are kept as they are.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        prose: list[str] = []
        for line in [*text.splitlines(), ""]:
            if line.strip() and not line[0].isspace():
                prose.append(line.strip())
                continue
            if prose:
                lines.append(textwrap.fill(" ".join(prose), width, initial_indent=indent, subsequent_indent=indent))
                prose.clear()
            lines.append(indent + line if line.strip() else "")
        return "\n".join(lines).rstrip("\n")

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never at a hyphen: "workbench-models" or "--rest_api_port" broken over two lines reads as two words.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, "", argparse.SUPPRESS) or action.nargs == 0:
            return text
        if isinstance(action, BoolFlag):
            return f"{text} (default: {str(action.default).lower()})"
        return super()._get_help_string(action)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, BoolFlag):  # "--enable_batching", not "--enable_batching [true|false]"
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def _spellings(parser: argparse.ArgumentParser) -> tuple[set[str], list[str]]:
    """Every option string ``parser`` knows, and those its help shows (the ones worth suggesting)."""
    # argparse has no public listing of a parser's options; ``_actions`` is stable from 3.2 to 3.14.
    actions = parser._actions  # noqa: SLF001 - argparse lists a parser's actions nowhere else
    known = {option for action in actions for option in action.option_strings}
    shown = [option for action in actions if action.help != argparse.SUPPRESS for option in action.option_strings]
    return known, shown


def _split_option(word: str) -> tuple[str, str] | None:
    """``--rest-api-port=8501`` → (``rest_api_port``, ``=8501``); None for a word that is not a long option."""
    if not word.startswith("--") or len(word) == 2:
        return None
    name, equals, value = word[2:].partition("=")
    return name.replace("-", "_"), equals + value


def canonical_options(
    words: Sequence[str], parser: argparse.ArgumentParser, aliases: Mapping[str, str] = OPTION_ALIASES
) -> list[str]:
    """``words`` with each option spelled as ``parser`` names it: dashes read as underscores, aliases resolved.

    A word after ``--`` is left alone, and so is an option ``parser`` does not know (it is reported as it was typed).
    """
    known, _ = _spellings(parser)
    out: list[str] = []
    for index, word in enumerate(words):
        if word == "--":
            return out + list(words[index:])
        split = _split_option(word)
        if split is not None and word.partition("=")[0] not in known:
            name, rest = split
            for candidate in (name, aliases.get(name, "")):
                if f"--{candidate}" in known:
                    word = f"--{candidate}{rest}"
                    break
        out.append(word)
    return out


def unrecognized_option(
    words: Sequence[str], parser: argparse.ArgumentParser, aliases: Mapping[str, str] = OPTION_ALIASES
) -> str | None:
    """What is wrong with the first option of ``words`` that ``parser`` does not know, with the nearest it does.

    Run after :func:`canonical_options`. argparse would take an unambiguous prefix (``--rest`` for
    ``--rest_api_port``) or report a mistyped option with no hint; here both get "did you mean".
    """
    known, shown = _spellings(parser)
    # A suggestion may come from an alias's spelling, but names the option itself.
    candidates = {option: option for option in shown}
    for alias, name in aliases.items():
        if f"--{name}" in shown:
            candidates.setdefault(f"--{alias}", f"--{name}")
    for word in words:
        if word == "--":
            return None
        split = _split_option(word)
        option = word.partition("=")[0]
        if split is None or option in known:
            continue
        return f"unrecognized option {option}{did_you_mean(f'--{split[0]}', candidates)}"
    return None


def did_you_mean(word: str, candidates: Collection[str] | Mapping[str, str]) -> str:
    """``": did you mean --rest_api_port?"`` for the candidate nearest ``word``, or ``""`` when none is near.

    ``candidates`` may map spellings to what to suggest for them.
    """
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.7)
    if not close:
        return ""
    suggestion = candidates[close[0]] if isinstance(candidates, Mapping) else close[0]
    return f": did you mean {suggestion}?"


class VocabularyParser(argparse.ArgumentParser):
    """argparse in workbench's vocabulary: aliases and dashes accepted, a mistyped flag or command answered with
    the nearest one, and every error ending with where help is."""

    commands: tuple[str, ...] = ()  # set on a parser of subcommands (the top level, `ray`): its subcommands

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        # TF Serving takes no abbreviated flags; a prefix (--rest) is a mistake to point out, not a flag to guess.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        if self.commands:  # the top level: the command's own parser reads the flags after it
            command = next((word for word in words if not word.startswith("-")), None)
            if command is not None and command not in self.commands:
                hint = did_you_mean(command, self.commands)
                self.error(f"unknown command {command!r}{hint} (commands: {', '.join(self.commands)})")
        else:
            words = canonical_options(words, self)
            problem = unrecognized_option(words, self)
            if problem:
                self.error(problem)
        return super().parse_known_args(words, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


class _TakesArguments(Protocol):
    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Argument:
    """One option (or positional) as ``add_argument`` takes it, declared once for every parser that has it: the
    command line adds it with :meth:`add_to`, a ``%serve`` magic with IPython's ``@argument(*a.flags, **a.options)``.
    """

    flags: tuple[str, ...]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, *flags: str, **options: Any) -> Argument:
        return cls(flags, options)

    def add_to(self, parser: _TakesArguments) -> None:
        parser.add_argument(*self.flags, **self.options)
