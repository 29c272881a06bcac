"""kern test: judge a candidate manifest against a reference, span by span (judge.py runs it;
diff, record, replay, precision, facts and verdict are its steps; pipeline.py judges a kern cut
folder; forked.py and candidate.py run the candidate in a process of its own)."""
