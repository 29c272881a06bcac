"""kern cut, in one place: the plan that slices a verified manifest into pipeline stages (pure,
plan.py), the stage folders and pipeline.json written from it (stages.py), the stages run in
sequence as one model (pipeline.py), and kern test of the stages against the manifest they were
cut from (judge.py). commands/cut.py is the command's flags."""
