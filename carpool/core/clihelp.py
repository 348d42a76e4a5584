"""Help output shared by the `carpool` commands: descriptions as written, defaults shown."""

from __future__ import annotations

import argparse
from typing import Any


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and each flag's default after its help (when it has
    one worth showing: not for on/off switches, unset options, or help that already
    says its default)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        # `is`, not `in`: 0 == False, and a default of 0 is worth showing.
        unset = default is None or default is False or default == "" or default == argparse.SUPPRESS
        if unset or "default" in text:
            return text
        if action.option_strings or action.nargs in ("?", "*"):
            return f"{text} (default: %(default)s)"
        return text


class HelpParser(argparse.ArgumentParser):
    """Every (sub)command's parser shows the defaults of its flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
