"""The loops and what drives them: each entry point's stage, the fit loop and its cadence, one batch's
optimization, evaluation, and the decisions the ranks take together."""
