"""kern cut, in one place: the plan that slices a verified manifest into pipeline stages (pure,
plan.py), the stage folders and pipeline.json written from it (stages.py), and the stages run
in sequence as one model (pipeline.py). Low in the house, beside world/, so that serving a cut
across devices can use it; kern test of the stages is kern test's (judge/pipeline.py), the
command's flags commands/cut.py."""
