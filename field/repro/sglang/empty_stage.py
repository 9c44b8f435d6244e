"""SGLang 0.5.23: a PP stage with no layers is accepted, and its KV transfer divides by zero.

`get_pp_indices` (sglang/srt/distributed/utils.py) accepts SGLANG_PP_LAYER_PARTITION=0,1,3
for 4 layers on PP3 (it checks the length and the sum only), so prefill stage 0 holds no
layers. Only a hand-set partition gets here: with the default rule a stage is empty only
when PP exceeds the layer count, and `make_layers` (sglang/srt/utils/common.py) refuses
that at start-up (`num_hidden_layers >= pp_size`).
Its KV transfer then calls `get_mha_kv_ptrs_with_pp` (common/conn.py) with no buffers,
which evaluates `dst_num_total_layers % num_kv_layers` with `num_kv_layers == 0`: a
ZeroDivisionError at transfer time instead of a refusal at startup: loud, no wrong KV
(field/defects.json: a hardening note, not a defect of serving). kvspec: LAYER-2.

Run with sglang==0.5.23 importable; exits 1 while the defect is there.
"""

import os
import sys
from types import SimpleNamespace

import _cpu  # noqa: F401  (torchvision stand-in on CPU-only machines)
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.distributed.utils import get_pp_indices

os.environ["SGLANG_PP_LAYER_PARTITION"] = "0,1,3"
try:
    start, end = get_pp_indices(4, 0, 3)
except ValueError as error:
    print(f"refused at startup: {error}")
    sys.exit(0)
print(f"prefill PP stage 0 of 3 holds layers [{start}, {end}): none")
stage = SimpleNamespace(kv_args=SimpleNamespace(prefill_start_layer=start))
decode = [0, 1, 2, 3, 1000, 1001, 1002, 1003]  # a PP1 decode's K and V buffers
try:
    CommonKVManager.get_mha_kv_ptrs_with_pp(stage, [], decode)
except ZeroDivisionError as error:
    print(f"its KV transfer fails: ZeroDivisionError: {error}")
sys.exit(1)
