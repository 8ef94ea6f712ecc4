"""YAML files here hold plain data: every loader reads them with `yaml.safe_load`, and says in one line why a file
was refused.

safe_load builds only mappings, lists, strings, numbers, booleans and null; a tag such as
`!!python/object/apply:os.system` (which `yaml.load` with the unsafe loader would call) is an error, never run.
"""
from __future__ import annotations

import re

import yaml

from .console import one_line

_TAG = re.compile(r"tag '([^']*)'")
_CORE_TAG_PREFIX = "tag:yaml.org,2002:"  # what "!!" stands for


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML text `yaml.safe_load` refused: `not valid YAML (line L, column C: problem)`, or for a tag
    that would build a Python object `tag !!python/... on line L is refused: ...`."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    tag = _TAG.search(problem) if isinstance(exc, yaml.constructor.ConstructorError) else None
    if tag is not None:
        name = tag.group(1).replace(_CORE_TAG_PREFIX, "!!")
        where = f" on line {mark.line + 1}" if mark is not None else ""
        return (f"tag {name}{where} is refused: only plain YAML data is read (mappings, lists, strings, numbers, "
                f"booleans, null)")
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"not valid YAML ({where}{one_line(problem)})"
