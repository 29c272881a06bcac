"""Natural-ish text for a grown workload: plain prose, tokenized by the checkpoint's own
tokenizer when its folder has one. A model's predictions on text are decisive where random
tokens leave near-ties everywhere, so a few rows of it settle what many random rows cannot."""

from __future__ import annotations

from pathlib import Path

from ..errors import KernError

TEXT = """\
The river ran low that summer, and the children of the village walked along its bed looking for
smooth stones. Their grandmother told them that the water had once reached the old mill, and that
the miller had kept a small boat tied to the door. Nobody believed her until the youngest found a
rusted ring set deep in the wall, just where she had said it would be.

A library is a quiet place, but it is never empty of voices. Every shelf holds letters, arguments,
recipes and maps, and a reader who opens a book joins a conversation that began long before. The
librarian in our town kept a notebook of the questions people asked: how to fix a bicycle chain,
why the moon looks larger near the horizon, what year the bridge was built, and how to bake bread
without yeast.

To make a simple soup, wash two carrots, one onion and a handful of lentils. Cut the vegetables into
small pieces and cook the onion in a little oil until it is soft. Add the carrots, the lentils and
a litre of water, then let everything simmer for thirty minutes. Season it with salt and pepper,
and serve it warm with a slice of bread.

The first computers filled whole rooms and needed teams of engineers to keep them running. Today a
phone in a pocket does more arithmetic in a second than those machines did in a year. What has not
changed is the need to check the answers: a program that is fast but wrong is worse than no program
at all, because people trust it.

In the spring the birds return to the hills above the lake. Some of them have flown thousands of
kilometres, following coastlines and rivers, resting in fields and gardens along the way. Scientists
fit a few of them with tiny tags to learn which routes they take, and every year the maps show
something new about how far a small bird can travel.

She opened the letter slowly, as if the words might escape. It was from her brother, who had moved
to the city ten years earlier and rarely wrote. He said that he was well, that the work was hard
but fair, and that he would come home for the harvest festival if the trains were running. She read
it twice, folded it, and put it on the table where everyone could see it.
"""


def tokens(folder: str | Path | None) -> tuple[int, ...] | None:
    """TEXT in the checkpoint's tokens, or None when the folder has no usable tokenizer."""
    if folder is None or not (Path(folder) / "tokenizer.json").is_file():
        return None
    from ..tokenizer import Tokenizer

    try:
        return tuple(Tokenizer(folder).encode(TEXT))
    except KernError:
        return None
