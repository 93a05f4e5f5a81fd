"""sandbox.tour: the closed-form check covers the stochastic rules too (no unexplained NaN)."""

import numpy as np

from sandbox.tour import DRAWS, autograd_check


def test_stochastic_rules_are_checked_against_the_mean_of_their_draws():
    table = autograd_check(["nsr_dapo", "dapo"]).set_index("objective")
    assert table.loc["nsr_dapo", "closed_form_check"] == f"mean of {DRAWS:,} draws"
    assert table.loc["dapo", "closed_form_check"] == "exact"
    assert np.isfinite(table["max_closed_form_error"]).all()
    assert table.loc["dapo", "max_closed_form_error"] < 1e-12
    # NSR keeps a clipped token with probability q: the mean of 20,000 Bernoulli draws of A r is
    # within a few standard errors (r <= 3: sd <= 3 / sqrt(20000) = 0.021) of E[coef]
    assert table.loc["nsr_dapo", "max_closed_form_error"] < 0.1
    assert table["max_autograd_error"].max() < 1e-12
