"""workbench's version: the package's (pyproject.toml reads it from here), and what servers report as theirs."""

__version__ = "0.1.0"
