"""A mistyped %pathways subcommand names the one meant (issue #31 item 9)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from pathways_kernel import magics
from pathways_kernel.magics import core, elastic, faults, goodput  # noqa: F401  (register their subcommands)


@pytest.mark.parametrize(("typed", "meant"), [("evnts", "events"), ("topolgy", "topology"), ("elastc", "elastic")])
def test_a_mistyped_subcommand_says_did_you_mean(typed, meant):
    with pytest.raises(UsageError, match=rf"unknown subcommand '{typed}'; did you mean '{meant}'\? choose one of: "):
        magics.dispatch(None, f"{typed} --last 3", None)  # type: ignore[arg-type]  (no shell needed to refuse it)


def test_a_word_like_none_lists_the_subcommands_without_a_guess():
    with pytest.raises(UsageError) as raised:
        magics.dispatch(None, "frobnicate", None)  # type: ignore[arg-type]
    assert "did you mean" not in str(raised.value) and "choose one of: " in str(raised.value)
