"""What may go into a Slurm job as it is, and how everything else is quoted.

Values that go into ``#SBATCH`` lines and ``sacctmgr`` arguments are never quoted there: they
must be plain words (``plain_word``). Everything a researcher typed goes into the script body,
quoted (``shell_quote``). Pure: no Django, no processes.
"""

import re
import shlex


class RenderError(ValueError):
    """The job cannot be expressed for this cluster (unmapped flavor, bad value)."""


# Values that go into #SBATCH lines and sacctmgr arguments are never quoted there: they
# must be plain words. Everything a researcher typed goes into the script body, quoted.
PLAIN_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+:@%=-]{0,127}$")
PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_./+@%:=-]{0,1023}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# A topology level's name, as experiments name the level they need (at most 63 characters).
LEVEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,62}$")


def shell_quote(value: str) -> str:
    """One shell word whose value is exactly ``value``, on one line.

    Printable text is single-quoted (nothing inside is special to the shell). Text with
    control characters (newlines, CR, tabs, escape) uses bash's ``$'…'`` with every control
    character, backslash and quote escaped, so the script stays one line per value: sbatch
    never mistakes part of a value for an ``#SBATCH`` line or a DOS line break.
    """
    if "\x00" in value:
        raise RenderError("values cannot contain NUL characters")
    if not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return shlex.quote(value)
    escaped = []
    for char in value:
        code = ord(char)
        if char == "\\":
            escaped.append("\\\\")
        elif char == "'":
            escaped.append("\\'")
        elif code < 0x20 or code == 0x7F:
            escaped.append(f"\\x{code:02x}")
        else:
            escaped.append(char)
    return "$'" + "".join(escaped) + "'"


def plain_word(value: str, what: str) -> str:
    if not PLAIN_WORD.match(value):
        raise RenderError(f"{what} {value!r} is not a plain Slurm name")
    return value
