"""Host-side cost of one decode step's engine.run with the program and the copies stubbed out: the
Python work between two steps (checks, env, inputs).

    python bench/host_overhead.py
"""
import time
import numpy as np
import kern.api as api

model = api.load()  # the embedded model, cpu
eng, proto = model.engine, model.protocol
for batch in (1, 16):
    st = proto.for_rows(batch, 1)
    (table,) = st.page_tables
    pt = np.zeros(eng.shapes[table.buffer], np.int32)[:batch]
    extra = {st.inputs["cu_seqlens"]: np.arange(batch + 1, dtype=np.int32)} if "cu_seqlens" in st.inputs else {}
    prog = eng.programs[st.program]
    real = prog.run
    prog.run = lambda env, *a: None
    dev_write = eng.device.write
    eng.device.write = lambda storage, host: None
    def step():
        env = eng.run(st.program, st.vars_for(batch, batch), {
            st.inputs["token"]: np.zeros(batch, np.int32),
            st.inputs["position"]: np.full(batch, 40, np.int32), table.buffer: pt, **extra})
    for _ in range(100): step()
    t0 = time.perf_counter()
    n = 2000
    for _ in range(n): step()
    dt = (time.perf_counter() - t0) / n
    print(f"batch {batch}: engine.run host work without the program or copies: {dt*1e6:.1f} us")
    prog.run = real
    eng.device.write = dev_write
