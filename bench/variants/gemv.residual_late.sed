# gemv_residual lets the next kernel launch after its wait, not at entry
s/gemv(XPlain{x}, W, YAddRes{res}, rows, N, K, true);/gemv(XPlain{x}, W, YAddRes{res}, rows, N, K);/
