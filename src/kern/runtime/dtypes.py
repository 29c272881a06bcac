"""Manifest dtypes as numpy dtypes (bf16 through ml-dtypes)."""

import ml_dtypes
import numpy as np

NP = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32, "i8": np.int8, "u8": np.uint8,
      "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64}
