"""Layer 7, measure: what every experiment uses to train seeds and report
them: seed runs, loss curves and landmarks, statistics over seeds, figures,
timing, continuations, and the report cells and write-out. Imports
training, parallel, models, core and hooks (docs/architecture.md, "The
layers"); interp, beside it at the top, is not among them.
"""
