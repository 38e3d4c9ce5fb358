"""The SGLang version this adapter was written against, and its check."""

from __future__ import annotations

SGLANG_VERSION = "0.5.23"


def installed_sglang_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def version_problem() -> str | None:
    """A message when the installed sglang is not the pinned one, else None."""
    installed = installed_sglang_version()
    if installed == SGLANG_VERSION:
        return None
    return (f"scout-sglang's attention backend needs sglang=={SGLANG_VERSION}, found "
            f"{installed or 'no sglang'}: install `pip install sglang=={SGLANG_VERSION}` or a scout-sglang release "
            f"built for sglang {installed}")
