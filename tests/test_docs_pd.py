"""docs/deployment.md's PD recipe is the one tests/test_sglang_pd.py runs: the page shows the launcher's
environment and each server's flags (scout_sglang/server/pd.py), and the test's own settings."""

import re
from pathlib import Path

from test_sglang_pd import COMMON, ENV

from scout_sglang.server.pd import DECODE_ARGS, PD_ENV, PREFILL_ARGS, page_args

DEPLOYMENT = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"


def shown_commands() -> str:
    """The page's text with shell line continuations joined and runs of spaces collapsed."""
    return re.sub(r"\s+", " ", DEPLOYMENT.read_text().replace("\\\n", " "))


def test_the_page_shows_the_flags_and_environment_the_launcher_uses():
    text = shown_commands()
    assert " ".join(PREFILL_ARGS) in text
    assert " ".join(DECODE_ARGS) in text
    assert " ".join(f"{name}={value}" for name, value in PD_ENV.items()) in text
    assert "python -m scout_sglang.server.pd" in text


def test_the_page_shows_the_settings_the_pd_test_runs_with():
    text = shown_commands()
    assert " ".join((*page_args(COMMON, ENV), *COMMON)) in text  # the launcher's page size, then the test's flags
    assert " ".join(f"{name}={value}" for name, value in ENV.items()) in text
