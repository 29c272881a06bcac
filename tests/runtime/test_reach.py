"""The decode step's reach: the host sets a var to the positions the step's rows reach (largest
position + 1), rounded up to a power of two (at least 64), so launches sized by the context
(decode attention's splits on CUDA) follow the real context, one graph a bucket. A position
past the step's reach is refused before launch."""

from __future__ import annotations

import numpy as np
import pytest

from kern.api import Model
from kern.manifest.protocol import ProtocolError
from kern.errors import BoundsError
from kern.drive.raw_pages import raw


def test_reach_rounds_up_to_power_of_two_buckets(tiny):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    dec, pre = model.protocol.for_rows(2, 1), model.protocol.for_rows(1, None)
    bound = model.verified.manifest.vars["reach"].max
    assert [dec.reach_bucket(n) for n in (1, 64, 65, 128, 129, bound)] == [64, 64, 128, 128, 256, bound]
    assert dec.vars_for(2, 2, reach=100) == {"seqs": 2, "reach": 128, "mask_rows": 1}
    assert dec.vars_for(2, 2) == {"seqs": 2, "mask_rows": 1}  # reach unset: the var stays at its bound
    assert "reach" not in pre.vars_for(1, 7, reach=7)  # prefill sizes nothing by it
    with pytest.raises(ProtocolError, match=rf"reaching {bound + 1} positions is outside the var bound reach <= {bound}"):
        dec.vars_for(1, 1, reach=bound + 1)


def test_a_position_past_the_steps_reach_is_refused_before_launch(tiny):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    st = model.protocol.for_rows(1, 1)
    (table,) = st.page_tables
    pages = raw(model).take(5)
    pt = np.zeros((1, model.engine.shapes[table.buffer][1]), np.int32)
    pt[0, :5] = pages
    inputs = {st.inputs["token"]: np.array([3], np.int32), st.inputs["position"]: np.array([64], np.int32),
              table.buffer: pt}
    with pytest.raises(BoundsError, match=r"input 'd_pos' holds values in \[64, 64\], outside its domain \[0, 64\)"):
        model.engine.run(st.program, st.vars_for(1, 1, reach=10), inputs)  # says 10, writes 65
    model.engine.run(st.program, st.vars_for(1, 1, reach=65), inputs)
    raw(model).give(pages)
